"""zhie's own encoder families by ``model_type``: the classes that stand for the ``model_type`` values transformers
lacks (``roformer_v2``, ``gau_alpha``: :mod:`zhie.encoders.gau`; ``zhie_conv``: :mod:`zhie.encoders.conv`;
``zhie_student_bert``: :mod:`zhie.encoders.student_bert`), and the config class of any ``model_type``, zhie's or
transformers'. Both loading a directory (:mod:`zhie.encoders.loading`) and building at random
(:mod:`zhie.encoders.scratch`) look them up here.
"""

from __future__ import annotations


def own_model_class(model_type: str | None):
    """zhie's class for a ``model_type`` transformers does not have (:mod:`zhie.encoders.gau`,
    :mod:`zhie.encoders.conv`, :mod:`zhie.encoders.student_bert`), else None."""
    from zhie.encoders import conv, gau, student_bert

    return {"roformer_v2": gau.RoFormerV2Model, "gau_alpha": gau.GAUAlphaModel,
            "zhie_conv": conv.ConvModel, "zhie_student_bert": student_bert.StudentBertModel}.get(model_type)


def config_class(model_type: str):
    own = own_model_class(model_type)
    if own is not None:
        return own.config_class
    from transformers import AutoConfig

    return type(AutoConfig.for_model(model_type))
