"""The ``zhie`` command: train, evaluate, predict, segment, embed, demo."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from zhie.data import FORMATS, DataError


def _train_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train", required=True, help="training file")
    p.add_argument("--dev", required=True, help="development file, evaluated after each epoch")
    p.add_argument("--encoder", default="e5-small",
                   help="a local HF model directory, e5-small (offline default), tiny, or a hub name")
    p.add_argument("--out", required=True, help="run directory (best/ holds the best model)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-5, help="encoder learning rate")
    p.add_argument("--head-lr", type=float, default=None, help="head learning rate (default: --lr)")
    p.add_argument("--crf-lr-multiplier", type=float, default=100.0,
                   help="the CRF transitions learn at --lr times this (spec: >= 100x the encoder's rate)")
    p.add_argument("--max-length", type=int, default=256, help="tokens per window, [CLS] and [SEP] included")
    p.add_argument("--ema", type=float, default=None, help="EMA decay of the weights used for evaluation")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--warmup", type=float, default=0.1, help="warm-up, as a fraction of all steps")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--patience", type=int, default=None, help="stop after N evaluations without improvement")
    p.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (default: each epoch)")
    p.add_argument("--encoder-layers", type=int, default=None, help="keep only the encoder's first N layers")
    p.add_argument("--keep-tokens", default="auto", choices=["auto", "all", "cjk", "data"],
                   help="prune the encoder vocabulary (char mode): auto = cjk for vocabularies over 50k")
    p.add_argument("--mixed-precision", default="no", choices=["no", "fp16", "bf16"])
    p.add_argument("--no-resume", action="store_true", help="start afresh even if --out has a checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _train_config(args):
    from zhie.training import TrainConfig

    return TrainConfig(epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch_size, lr=args.lr,
                       head_lr=args.head_lr, crf_lr_multiplier=args.crf_lr_multiplier, ema=args.ema, seed=args.seed,
                       warmup=args.warmup, grad_accum=args.grad_accum, patience=args.patience,
                       eval_every=args.eval_every, mixed_precision=args.mixed_precision)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zhie", description="Chinese information extraction in PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser("train", help="train a model")
    tasks = train.add_subparsers(dest="task", required=True, metavar="TASK")
    ner = tasks.add_parser("ner", help="named-entity recognition (softmax, crf, gp, egp heads)")
    _train_flags(ner)
    ner.add_argument("--format", default="auto", choices=["auto", *FORMATS])
    ner.add_argument("--head", default="gp", choices=["softmax", "crf", "gp", "egp"])
    ner.add_argument("--mode", default="char", choices=["char", "subword"],
                     help="char: one token per character (Chinese); subword: the tokenizer's own tokens")
    ner.add_argument("--flatten", action="store_true",
                     help="crf/softmax heads: keep the outermost of nested entities instead of refusing")

    cws = tasks.add_parser("cws", help="Chinese word segmentation (crf, softmax heads; BMES tags)")
    _train_flags(cws)
    cws.add_argument("--head", default="crf", choices=["crf", "softmax"])

    rel = tasks.add_parser("re", help="relation extraction with GPLinker (triples)")
    _train_flags(rel)
    rel.add_argument("--schema", default=None, help="schema.json (JSON lines with 'predicate'); default: from data")
    rel.add_argument("--variant", default="egp", choices=["gp", "egp"])

    sts = tasks.add_parser("sts", help="sentence embeddings from sentence pairs (CoSENT, Sentence-BERT, cosine-MSE)")
    _train_flags(sts)
    sts.add_argument("--loss", default="cosent", choices=["cosent", "sbert", "cosine-mse"])
    sts.add_argument("--pooling", default="cls", choices=["cls", "mean", "first-last-avg"])
    sts.add_argument("--prefix", default=None, help='text put before every sentence (default: "query: " for e5)')
    sts.set_defaults(max_length=64)

    ev = sub.add_parser("eval", help="evaluate a trained model on a labelled file")
    ev.add_argument("model", help="model directory (or a run directory with best/)")
    ev.add_argument("--data", required=True)
    ev.add_argument("--format", default="auto", choices=["auto", *FORMATS])
    ev.add_argument("--json", default=None, help="also write the metrics to this JSON file")
    ev.add_argument("--batch-size", type=int, default=32)

    pr = sub.add_parser("predict", help="predict entities or relations; JSON lines out, in input order")
    pr.add_argument("model", help="model directory (or a run directory with best/)")
    pr.add_argument("texts", nargs="*", help="texts to process (or use --input)")
    pr.add_argument("--input", default=None, help="one text per line, or JSON lines with a 'text' field")
    pr.add_argument("--batch-size", type=int, default=32)

    seg = sub.add_parser("segment", help="segment text into words with a trained cws model")
    seg.add_argument("model", help="model directory (or a run directory with best/)")
    seg.add_argument("texts", nargs="*", help="texts to segment (or use --input)")
    seg.add_argument("--input", default=None, help="one text per line, or JSON lines with a 'text' field")
    seg.add_argument("--json", action="store_true", help="JSON lines with the words and their offsets")
    seg.add_argument("--batch-size", type=int, default=32)

    emb = sub.add_parser("embed", help="sentence vectors from a trained sts model")
    emb.add_argument("model", help="model directory (or a run directory with best/)")
    emb.add_argument("texts", nargs="*", help="texts to embed (or use --input)")
    emb.add_argument("--input", default=None, help="one text per line, or JSON lines with a 'text' field")
    emb.add_argument("--output", default=None, help="write a [n, hidden] float32 .npy file instead of JSON lines")
    emb.add_argument("--no-normalize", action="store_true", help="raw pooled vectors, not L2-normalised")
    emb.add_argument("--batch-size", type=int, default=64)

    demo = sub.add_parser("demo", help="train, evaluate and predict on a small corpus zhie writes itself")
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--encoder", default="e5-small")
    demo.add_argument("--head", default="gp", choices=["softmax", "crf", "gp", "egp"])
    demo.add_argument("--epochs", type=int, default=2)
    demo.add_argument("--quiet", action="store_true")
    return parser


def read_texts(path: str) -> list[str]:
    """One text per line, or JSON lines with a "text" field (blank lines skipped)."""
    texts = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(path, lineno, f"malformed JSON: {err.msg}") from None
                if not isinstance(record.get("text"), str):
                    raise DataError(path, lineno, "a JSON line needs a string field 'text'")
                texts.append(record["text"])
            else:
                texts.append(line)
    return texts


def cmd_train(args) -> None:
    if args.task == "cws":
        from zhie.tasks.cws import train_cws

        result = train_cws(args.train, args.dev, out=args.out, encoder=args.encoder, head=args.head,
                           max_length=args.max_length, keep_tokens=args.keep_tokens,
                           encoder_layers=args.encoder_layers, config=_train_config(args),
                           resume=not args.no_resume, progress=not args.quiet)
        return print_best(args, result)
    if args.task == "sts":
        from zhie.tasks.similarity import train_sts

        result = train_sts(args.train, args.dev, out=args.out, encoder=args.encoder, loss=args.loss,
                           pooling=args.pooling, max_length=args.max_length, prefix=args.prefix,
                           encoder_layers=args.encoder_layers, config=_train_config(args),
                           resume=not args.no_resume, progress=not args.quiet)
        return print_best(args, result)
    if args.task == "re":
        from zhie.tasks.relation import train_relations

        result = train_relations(args.train, args.dev, out=args.out, schema=args.schema, encoder=args.encoder,
                                 variant=args.variant, max_length=args.max_length, keep_tokens=args.keep_tokens,
                                 encoder_layers=args.encoder_layers, config=_train_config(args),
                                 resume=not args.no_resume, progress=not args.quiet)
        return print_best(args, result)
    from zhie.tasks.ner import train_ner

    result = train_ner(args.train, args.dev, out=args.out, encoder=args.encoder, head=args.head,
                       format=args.format, mode=args.mode, max_length=args.max_length, flatten=args.flatten,
                       keep_tokens=args.keep_tokens, encoder_layers=args.encoder_layers,
                       config=_train_config(args), resume=not args.no_resume, progress=not args.quiet)
    print_best(args, result)


def print_best(args, result: dict) -> None:
    best = {"best": result["best"], "best_step": result.get("best_step"), "model": str(Path(args.out) / "best")}
    print(json.dumps(best, ensure_ascii=False))


def print_report(metrics: dict) -> None:
    print(f"{'type':<16}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}")
    for label, m in metrics["per_type"].items():
        print(f"{label:<16}{m['precision']:>10.4f}{m['recall']:>10.4f}{m['f1']:>10.4f}{m['support']:>10}")
    m = metrics["micro"]
    print(f"{'micro':<16}{m['precision']:>10.4f}{m['recall']:>10.4f}{m['f1']:>10.4f}{metrics['n_gold']:>10}")


def cmd_eval(args) -> None:
    import zhie
    from zhie.data import read_ner
    from zhie.data.cws import read_segmented

    pipe = zhie.load(args.model)
    if pipe.task.name in ("cws", "re", "sts"):
        from zhie.data.spo import read_spo
        from zhie.data.sts import read_pairs

        reader = {"cws": read_segmented, "re": read_spo, "sts": read_pairs}[pipe.task.name]
        metrics = pipe.evaluate(reader(args.data), batch_size=args.batch_size)
        print(json.dumps(metrics, ensure_ascii=False))
    else:
        metrics = pipe.evaluate(read_ner(args.data, args.format), batch_size=args.batch_size)
        print_report(metrics)
    if args.json:
        Path(args.json).write_text(json.dumps(metrics, ensure_ascii=False, indent=2), encoding="utf-8")


def input_texts(args) -> list[str]:
    texts = list(args.texts) + (read_texts(args.input) if args.input else [])
    if not texts:
        raise ValueError(f"nothing to {args.command}: give texts as arguments or --input FILE")
    return texts


def cmd_predict(args) -> None:
    import zhie

    texts = input_texts(args)
    pipe = zhie.load(args.model)
    if pipe.task.name == "sts":
        raise ValueError(f"{args.model} is a sentence-embedding model: use `zhie embed`")
    key = "relations" if pipe.task.name == "re" else "entities"
    for text, found in zip(texts, pipe.predict(texts, batch_size=args.batch_size)):
        print(json.dumps({"text": text, key: [x.to_dict() for x in found]}, ensure_ascii=False))


def cmd_segment(args) -> None:
    import zhie

    texts = input_texts(args)
    pipe = zhie.load(args.model)
    if pipe.task.name != "cws":
        raise ValueError(f"{args.model} is a {pipe.task.name!r} model; `zhie segment` needs a cws model")
    for text, spans in zip(texts, pipe.segment_spans(texts, batch_size=args.batch_size)):
        if args.json:
            words = [{"start": s.start, "end": s.end, "text": s.text} for s in spans]
            print(json.dumps({"text": text, "words": words}, ensure_ascii=False))
        else:
            print("  ".join(s.text for s in spans if not s.text.isspace()))


def cmd_embed(args) -> None:
    import numpy as np

    import zhie

    texts = input_texts(args)
    pipe = zhie.load(args.model)
    if pipe.task.name != "sts":
        raise ValueError(f"{args.model} is a {pipe.task.name!r} model; `zhie embed` needs an sts model")
    vectors = pipe.encode(texts, batch_size=args.batch_size, normalize=not args.no_normalize)
    if args.output:
        np.save(args.output, vectors)
        print(f"{args.output}: {vectors.shape[0]} x {vectors.shape[1]} float32", file=sys.stderr)
    else:
        for text, v in zip(texts, vectors):
            print(json.dumps({"text": text, "embedding": [round(float(x), 6) for x in v]}, ensure_ascii=False))


def cmd_demo(args) -> None:
    import zhie
    from zhie import demo
    from zhie.data import read_ner
    from zhie.tasks.ner import train_ner
    from zhie.training import TrainConfig

    start = time.time()
    out = Path(args.out)
    train_file, dev_file = demo.write_corpus(out / "data")
    print(f"corpus: {train_file} and {dev_file} (written by zhie.demo, templates and made-up names)")
    config = TrainConfig(epochs=args.epochs, batch_size=16, lr=5e-5, head_lr=1e-3, seed=42)
    train_ner(train_file, dev_file, out=out, encoder=args.encoder, head=args.head, config=config,
              resume=False, progress=not args.quiet)
    pipe = zhie.load(out / "best")
    print(f"\ndev set ({dev_file}):")
    print_report(pipe.evaluate(read_ner(dev_file)))
    print("\npredictions on new sentences:")
    for text, spans in zip(demo.SAMPLES, pipe.predict(demo.SAMPLES)):
        print(json.dumps({"text": text, "entities": [s.to_dict() for s in spans]}, ensure_ascii=False))
    print(f"\nmodel saved in {out / 'best'}; done in {time.time() - start:.0f} s")


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "predict": cmd_predict, "segment": cmd_segment, "embed": cmd_embed,
            "demo": cmd_demo}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except (DataError, ValueError, FileNotFoundError, NotADirectoryError, OSError) as err:
        print(f"zhie: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
