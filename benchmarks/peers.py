"""Peers side by side, in one process, on the same encoder (e5-small, vocabulary pruned as zhie trains it) and the
same data (CLUENER), with roofline figures (benchmarks/roofline.py):

    python benchmarks/peers.py crf                    # zhie's CRF against pytorch-crf (log-likelihood, Viterbi)
    python benchmarks/peers.py predict --texts 300    # zhie against HF pipeline("token-classification")
    python benchmarks/peers.py train --steps 12       # GP NER training: zhie, bert4torch's GP example, HF Trainer

Clock: on the CPU every part runs with ``--threads`` torch threads (default 1) and is timed by ``time.process_time``
(CPU seconds of this process; the machine is shared, and wall time would count the other processes' turns); on a
GPU by wall time with ``torch.cuda.synchronize``. Training throughput counts real tokens (``attention_mask`` sums),
from the start of step ``--warmup`` to the start of the last step, measured inside each framework's own loop.

bert4torch needs undeclared imports and a torchvision stub; it runs in its own environment
(``bash ../shared/tools/peers-setup.sh``, ``--peers-env``, default ``~/.cache/zhie-peers``) as a subprocess of this
script (``bert4torch-worker``), on the same encoder weights and the same tokenised batches' data.
Each measurement appends one JSON line to ``benchmarks/results/peers.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from statistics import median

import torch
from roofline import wall_clock

BENCH = Path(__file__).resolve().parent
CLUENER = Path(os.environ.get("ZHIE_DATA") or BENCH.parents[1] / "shared" / "data") / "ner" / "cluener"


def clock(device: torch.device) -> float:
    """CPU seconds of this process on the CPU; wall seconds after a synchronisation on a GPU."""
    return wall_clock(device) if device.type == "cuda" else time.process_time()


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = clock(device)
        fn()
        times.append(clock(device) - start)
    return median(times)


def describe(args, device: torch.device) -> dict:
    from common import machine

    return {"machine": machine(), "threads": torch.get_num_threads(), "device": device.type,
            "clock": "wall (cuda synchronised)" if device.type == "cuda" else "process_time",
            "date": date.today().isoformat(), "command": "python " + " ".join(sys.argv)}


# ------------------------------------------------------------------------------------------------------------ CRF
def crf_part(args, device: torch.device) -> None:
    """zhie's CRF against pytorch-crf: log-likelihood forward (no grad), forward + backward, Viterbi; same inputs,
    and the results are compared in the same run."""
    from common import append_result

    for b, n in [(32, 64), (32, 128), (32, 256)]:
        times, same = crf_compare(b, n, args.tags, device, args.repeats)
        for what, (t_ours, t_ref) in times.items():
            append_result("peers", {"part": "crf", "what": what, "batch": b, "steps": n, "tags": args.tags,
                                    "zhie_ms": 1e3 * t_ours, "pytorch_crf_ms": 1e3 * t_ref, "speedup": t_ref / t_ours,
                                    **same, "repeats": args.repeats, **describe(args, device)})


def crf_compare(b: int, n: int, L: int, device: torch.device, repeats: int) -> tuple[dict, dict]:
    """Seconds ``{what: (zhie, pytorch-crf)}`` and whether the log-likelihoods and best paths agree, on a random
    batch of ``b`` sequences of ``n // 2 .. n`` steps."""
    import torchcrf

    from zhie.heads import CRF

    g = torch.Generator().manual_seed(0)
    ours = CRF(L).to(device)
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    ref = torchcrf.CRF(L, batch_first=True).to(device)
    ref.load_state_dict(ours.state_dict())
    emissions = torch.randn(b, n, L, generator=g).to(device)
    lengths = torch.randint(n // 2, n + 1, (b,), generator=g)
    lengths[0] = n
    mask = (torch.arange(n)[None, :] < lengths[:, None]).to(device)
    tags = (torch.randint(0, L, (b, n), generator=g) * mask.cpu()).to(device)
    em = emissions.clone().requires_grad_()

    def train_ours():
        ours.zero_grad()
        ours.log_likelihood(em, tags, mask).sum().backward()

    def train_ref():
        ref.zero_grad()
        ref(em, tags, mask, reduction="sum").backward()

    with torch.no_grad():
        same_ll = torch.allclose(ours.log_likelihood(emissions, tags, mask),
                                 ref(emissions, tags, mask, reduction="none"), atol=1e-3, rtol=1e-5)
        paths = ours.viterbi(emissions, mask)[0]
        same_paths = [row[row >= 0].tolist() for row in paths.cpu()] == ref.decode(emissions, mask)
        times = {"forward": (timed(lambda: ours.log_likelihood(emissions, tags, mask), device, repeats),
                             timed(lambda: ref(emissions, tags, mask, reduction="none"), device, repeats)),
                 "viterbi": (timed(lambda: ours.viterbi(emissions, mask), device, repeats),
                             timed(lambda: ref.decode(emissions, mask), device, repeats))}
    times["forward_backward"] = (timed(train_ours, device, repeats), timed(train_ref, device, repeats))
    return times, {"same_log_likelihood": same_ll, "same_paths": same_paths}


# ------------------------------------------------------------------------------------------------------------ data
def cluener(split: str, count: int):
    from zhie.data import read_ner

    return read_ner(CLUENER / f"{split}.json")[:count]


def zhie_setup(encoder_name: str, train_examples, texts: list[str], head: str = "gp"):
    """zhie's NER task and model on the encoder with the vocabulary pruned to these texts (as ``zhie.fit`` does)."""
    from zhie.model import Model
    from zhie.tasks.base import prepare_encoder
    from zhie.tasks.ner import NerTask

    config = NerTask.configure(train_examples, encoder=encoder_name, head=head)
    encoder, tokenizer = prepare_encoder(encoder_name, texts=texts, mode=config.mode)
    task = NerTask(config, tokenizer)
    task.encode(train_examples)  # as zhie.fit: GP's cells start at the prior logit (an untrained head predicts little)
    torch.manual_seed(0)
    return task, Model(encoder, task.build_heads(encoder.config.hidden_size))


# ------------------------------------------------------------------------------------------------------------ predict
def predict_part(args, device: torch.device, peak: float) -> None:
    """zhie's prediction against HF ``pipeline("token-classification")`` (its own subword tokenisation and entity
    aggregation) on the same encoder weights: zhie's NER model ``--model`` (else an untrained GP head) against the
    pipeline with a new linear head over the same tags (throughput only)."""
    from common import append_result
    from roofline import flops_per_token, roofline, window_tokens
    from transformers import AutoModelForTokenClassification, pipeline

    import zhie

    texts = [ex.text for ex in cluener("dev", args.texts)]
    if args.model:
        pipe = zhie.load(args.model, device=device.type)
        task, model = pipe.task, pipe.model
    else:
        train = cluener("train", 200)
        task, model = zhie_setup(args.encoder, train, [ex.text for ex in train] + texts)
    model.to(device).eval()
    zhie_s = timed(lambda: task.predict(model, texts, batch_size=args.batch_size), device, 1)
    zhie_tokens = window_tokens(task, texts)

    with tempfile.TemporaryDirectory() as tmp:
        model.encoder.save_pretrained(tmp)
        task.tokenizer.save_pretrained(tmp)
        hf_model = AutoModelForTokenClassification.from_pretrained(tmp, num_labels=len(task.config.tags))
    hf = pipeline("token-classification", model=hf_model, tokenizer=task.tokenizer, device=device,
                  aggregation_strategy="simple")
    hf_s = timed(lambda: hf(texts, batch_size=args.batch_size), device, 1)
    hf_tokens = [len(task.tokenizer(t)["input_ids"]) for t in texts]
    config = model.encoder.config
    for name, seconds, tokens in [("zhie", zhie_s, zhie_tokens), ("hf_pipeline", hf_s, hf_tokens)]:
        append_result("peers", {"part": "predict", "framework": name, "model": args.model or "untrained gp",
                                "texts": len(texts), "tokens": sum(tokens),
                                "sent_per_s": len(texts) / seconds, "tokens_per_s": sum(tokens) / seconds,
                                "speedup_vs_hf": hf_s / seconds, "batch_size": args.batch_size,
                                **roofline(flops_per_token(config, tokens), sum(tokens) / seconds, peak),
                                **describe(args, device)})


# ------------------------------------------------------------------------------------------------------------ train
def throughput(stamps: list[tuple[float, int]], warmup: int) -> dict:
    """Tokens/s from ``(clock at a step's start, its real tokens)``: steps ``warmup`` .. last-1."""
    counted = stamps[warmup:-1]
    seconds = stamps[-1][0] - counted[0][0]
    return {"steps_timed": len(counted), "tokens_timed": sum(t for _, t in counted), "seconds": seconds,
            "tokens_per_s": sum(t for _, t in counted) / seconds}


def train_zhie(task, model, train, args, device) -> dict:
    """zhie's own training loop (:func:`zhie.training.train`) on the GP head, timed at each loss call."""
    from zhie.training import TrainConfig
    from zhie.training import train as train_loop

    items = task.encode(train)
    objective = task.objective(model.encoder.config.hidden_size)
    stamps: list[tuple[float, int]] = []

    def loss_fn(m, batch):
        stamps.append((clock(device), int(batch["attention_mask"].sum())))
        return objective(m, batch)

    config = TrainConfig(batch_size=args.batch_size, max_steps=args.steps, lr=2e-4, head_lr=2e-3, seed=42)
    with tempfile.TemporaryDirectory() as tmp:
        train_loop(model, items, collate=task.collate, loss_fn=loss_fn, config=config, out_dir=Path(tmp),
                   lengths=[len(it.ids) for it in items], resume=False, progress=False)
    return throughput(stamps, args.warmup)


def train_hf(task, model, train, args, device) -> dict:
    """A plain HF ``Trainer`` with ``AutoModelForTokenClassification`` (softmax over the BIO tags) on the same
    char-level inputs."""
    from transformers import AutoModelForTokenClassification, Trainer, TrainingArguments

    from zhie.tasks.ner import NerConfig, TagLabels

    items = task.encode(train)
    tag_ids = TagLabels(NerConfig(task.config.labels, head="softmax"))
    rows = [{"input_ids": task.text_tokenizer.model_input(it.ids),
             "labels": [-100, *tag_ids.tags(it.spans, len(it.ids)), -100]} for it in items]
    pad_id = task.text_tokenizer.pad_id
    stamps: list[tuple[float, int]] = []

    def collate(batch):
        n = max(len(r["input_ids"]) for r in batch)
        ids = torch.tensor([r["input_ids"] + [pad_id] * (n - len(r["input_ids"])) for r in batch])
        labels = torch.tensor([r["labels"] + [-100] * (n - len(r["labels"])) for r in batch])
        mask = (torch.arange(n)[None, :] < torch.tensor([len(r["input_ids"]) for r in batch])[:, None]).long()
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    class TimedTrainer(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            stamps.append((clock(device), int(inputs["attention_mask"].sum())))
            return super().training_step(model, inputs, num_items_in_batch)

    with tempfile.TemporaryDirectory() as tmp:
        model.encoder.save_pretrained(tmp)
        task.tokenizer.save_pretrained(tmp)
        hf_model = AutoModelForTokenClassification.from_pretrained(tmp, num_labels=len(task.config.tags))
        targs = TrainingArguments(output_dir=tmp, per_device_train_batch_size=args.batch_size, max_steps=args.steps,
                                  learning_rate=2e-4, warmup_steps=1, report_to=[], save_strategy="no",
                                  logging_strategy="no", use_cpu=device.type == "cpu", dataloader_num_workers=0,
                                  disable_tqdm=True, seed=42)
        TimedTrainer(model=hf_model, args=targs, train_dataset=rows, data_collator=collate).train()
    return throughput(stamps, args.warmup)


def train_bert4torch(task, model, train, args, device) -> dict:
    """bert4torch's GlobalPointer example setup (BERT + ``GlobalPointer(heads, 64)`` + dense multilabel CE, Adam),
    in the peers environment, on the same encoder weights and training windows."""
    items = task.encode(train)
    with tempfile.TemporaryDirectory() as tmp:
        torch.save({f"bert.{k}": v for k, v in model.encoder.state_dict().items()}, f"{tmp}/pytorch_model.bin")
        config = {**model.encoder.config.to_dict(), "pad_token_id": task.text_tokenizer.pad_id}
        Path(tmp, "bert4torch_config.json").write_text(json.dumps(config))
        data = [{"ids": task.text_tokenizer.model_input(it.ids), "spans": it.spans} for it in items]
        Path(tmp, "data.json").write_text(json.dumps({"items": data, "heads": len(task.config.labels),
                                                      "pad_id": task.text_tokenizer.pad_id}))
        env = {**os.environ, "PYTHONPATH": f"{args.peers_env}/stubs"}
        cmd = [f"{args.peers_env}/bin/python", "-W", "ignore", __file__, "bert4torch-worker", "--dir", tmp,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch-size", str(args.batch_size),
               "--threads", str(args.threads), "--device", device.type]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        return {"error": out.stderr[-2000:]}
    print(out.stderr[-3000:], file=sys.stderr)  # bert4torch's own report (e.g. weights it did not load)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bert4torch_worker(args) -> None:
    """Runs in the peers environment: bert4torch's GP NER example, timed at each batch's start."""
    import numpy as np
    from bert4torch.callbacks import Callback
    from bert4torch.layers import GlobalPointer
    from bert4torch.losses import MultilabelCategoricalCrossentropy
    from bert4torch.models import BaseModel, build_transformer_model
    from torch.utils.data import DataLoader

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    data = json.loads(Path(args.dir, "data.json").read_text())
    heads, pad_id = data["heads"], data["pad_id"]
    tokens: list[int] = []

    def collate(batch):
        n = max(len(it["ids"]) for it in batch)
        ids = np.full((len(batch), n), pad_id, dtype=np.int64)
        labels = np.zeros((len(batch), heads, n, n), dtype=np.int64)
        for i, it in enumerate(batch):
            ids[i, : len(it["ids"])] = it["ids"]
            for s, e, k in it["spans"]:
                labels[i, k, s + 1, e + 1] = 1
        tokens.append(int((ids != pad_id).sum()))
        return torch.tensor(ids, device=device), torch.tensor(labels, device=device)

    class Model(BaseModel):
        def __init__(self):
            super().__init__()
            self.bert = build_transformer_model(config_path=f"{args.dir}/bert4torch_config.json",
                                                checkpoint_path=f"{args.dir}/pytorch_model.bin",
                                                segment_vocab_size=0, pad_token_id=pad_id)
            self.global_pointer = GlobalPointer(hidden_size=self.bert.hidden_size if hasattr(self.bert, "hidden_size")
                                                else 384, heads=heads, head_size=64)

        def forward(self, token_ids):
            hidden = self.bert([token_ids])  # bert4torch >= 0.5 returns a dict
            hidden = hidden["last_hidden_state"] if isinstance(hidden, dict) else hidden
            return self.global_pointer(hidden, token_ids.ne(pad_id).long())

    class Loss(MultilabelCategoricalCrossentropy):
        def forward(self, y_pred, y_true):
            return super().forward(y_pred.view(y_pred.shape[0] * y_pred.shape[1], -1),
                                   y_true.view(y_true.shape[0] * y_true.shape[1], -1))

    stamps: list[tuple[float, int]] = []

    class Stamp(Callback):
        def on_batch_begin(self, global_step, local_step, logs=None):
            stamps.append((clock(device), 0))

    torch.manual_seed(42)
    model = Model().to(device)
    model.compile(loss=Loss(), optimizer=torch.optim.Adam(model.parameters(), lr=2e-5))
    loader = DataLoader(data["items"], batch_size=args.batch_size, shuffle=True, collate_fn=collate)
    checkpoint = torch.load(f"{args.dir}/pytorch_model.bin", weights_only=True)
    params = list(model.bert.parameters())
    loaded = sum(any(p.shape == w.shape and torch.equal(p.cpu(), w) for p in params) for w in checkpoint.values())
    model.fit(loader, epochs=1, steps_per_epoch=args.steps, callbacks=[Stamp()], verbose=0)
    stamps = [(t, n) for (t, _), n in zip(stamps, tokens)]
    print(json.dumps({**throughput(stamps, args.warmup), "encoder_tensors_loaded": f"{loaded}/{len(checkpoint)}"}))


def train_part(args, device: torch.device, peak: float) -> None:
    """Each framework in turn, one JSON line each (zhie first: the others' lines carry zhie's speed-up over them)."""
    from common import append_result
    from roofline import flops_per_token, roofline

    train = cluener("train", args.sentences)
    runs = {"zhie": train_zhie, "bert4torch": train_bert4torch, "hf_trainer": train_hf}
    zhie_rate = None
    for name in args.frameworks:
        task, model = zhie_setup(args.encoder, train, [ex.text for ex in train])
        r = runs[name](task, model.to(device), train, args, device)
        row = {"part": "train", "framework": name, "sentences": len(train), "batch_size": args.batch_size, **r}
        if "tokens_per_s" in r:
            per_token = flops_per_token(model.encoder.config, [len(it.ids) + 2 for it in task.encode(train)], True)
            row.update(roofline(per_token, r["tokens_per_s"], peak))
            zhie_rate = r["tokens_per_s"] if name == "zhie" else zhie_rate
            if zhie_rate:
                row["zhie_speedup"] = zhie_rate / r["tokens_per_s"]
        append_result("peers", {**row, **describe(args, device)})


# ------------------------------------------------------------------------------------------------------------ main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=["crf", "predict", "train", "bert4torch-worker"])
    p.add_argument("--encoder", default="e5-small", help="name or directory (a GPU machine: the carried pruned copy)")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (timed by process_time)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=5, help="crf: timed calls per measurement (median)")
    p.add_argument("--tags", type=int, default=21, help="crf: tags (CLUENER's BIO: 21)")
    p.add_argument("--texts", type=int, default=300, help="predict: CLUENER dev texts")
    p.add_argument("--model", help="predict: a trained zhie NER model directory (default: an untrained GP head)")
    p.add_argument("--batch-size", type=int, default=None, help="predict: 32; train: 16")
    p.add_argument("--sentences", type=int, default=400, help="train: CLUENER training sentences")
    p.add_argument("--steps", type=int, default=12, help="train: optimiser steps per framework")
    p.add_argument("--warmup", type=int, default=2, help="train: steps not timed")
    p.add_argument("--frameworks", nargs="+", default=["zhie", "bert4torch", "hf_trainer"], help="train: which")
    p.add_argument("--peers-env", default=str(Path.home() / ".cache" / "zhie-peers"))
    p.add_argument("--dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.batch_size = args.batch_size or (32 if args.part == "predict" else 16)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    if args.part == "bert4torch-worker":
        return bert4torch_worker(args)
    from roofline import matmul_peak

    device = torch.device(args.device)
    if args.part == "crf":
        return crf_part(args, device)
    peak = matmul_peak(device, torch.float32, clock=lambda: clock(device))  # the runs here are fp32
    (predict_part if args.part == "predict" else train_part)(args, device, peak)


if __name__ == "__main__":
    from common import machine_lock

    with machine_lock():
        main()
