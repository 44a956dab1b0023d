"""Several tasks on one shared encoder: the loss-weighting and gradient schemes of spec §5 (:mod:`.weighting`)."""
