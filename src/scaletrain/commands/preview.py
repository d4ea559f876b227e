"""`scaletrain preview CONFIG [k=v ...] [-n N] [--ids]`: the first N training examples exactly as they train (after
templating and truncation), trained tokens marked. From the run's data cache when it exists (memory-mapped: only
what is shown is read); else from the first N records of each source, tokenized into a temporary cache."""

from __future__ import annotations

import argparse
import sys

from scaletrain.commands.args import COUNT


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("preview", parents=parents, help="show exactly what trains: examples with their trained "
                                                        "tokens marked")
    p.add_argument("config", help="the training config")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides")
    p.add_argument("-n", type=COUNT, default=3, help="examples to show (default 3)")
    p.add_argument("--ids", action="store_true", help="also the (label, id) pair of every token")
    p.add_argument("--split", choices=["train", "eval"], default="train", help="which split's examples to show")
    p.set_defaults(func=run)


def examples(cfg, n: int, split: str = "train"):
    """(tokenizer, the first ``n`` examples of ``split``, where they were read from)."""
    import tempfile

    from scaletrain.data.prepare import cached_entry, prepare_data
    from scaletrain.errors import ConfigError
    from scaletrain.model.processor import image_text_factory
    from scaletrain.model.tokenizer import load_tokenizer

    if cfg.model.task != "causal-lm":
        raise ConfigError("scaletrain preview shows causal-LM examples (their trained tokens); this config has "
                          f"model.task={cfg.model.task}")
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    if cfg.data.streaming and split == "train":  # the stream's first records, as the driver checks them
        from scaletrain.data.stream import SAMPLE, prepare_stream

        data = prepare_stream(cfg, tokenizer)
        return tokenizer, [data.train[i] for i in range(min(n, len(data.train)))], (
            f"the first {SAMPLE} records of the stream's first shard ({data.stream.shards[0]})")
    images = image_text_factory(cfg.model.name_or_path, tokenizer) if not cfg.data.streaming else None
    cached = cached_entry(cfg, tokenizer, images)
    if cached is not None:
        import datasets

        ds = datasets.load_from_disk(str(cached / split))
        return tokenizer, ds.select(range(min(n, len(ds)))), f"the data cache {cached}"
    with tempfile.TemporaryDirectory(prefix="scaletrain-preview-") as tmp:
        # twice the examples asked, half of them eval when the config holds some out (for --split eval)
        d = cfg.data.model_copy(update={"max_samples": max(n, 1) * 2, "cache_dir": tmp,
                                        "eval_ratio": cfg.data.eval_ratio and 0.5})
        data = prepare_data(cfg.model_copy(update={"data": d}), tokenizer, images)
        ds = data.train if split == "train" else data.eval
        rows = [ds[i] for i in range(min(n, len(ds)))]
    return tokenizer, rows, f"the first {d.max_samples} records of each source (no data cache yet)"


def run(args: argparse.Namespace) -> int:
    from scaletrain.config import load_config
    from scaletrain.console import console
    from scaletrain.data.preview import describe
    from scaletrain.errors import ConfigError

    if args.n < 1:
        raise ConfigError(f"-n {args.n}: show at least 1 example")
    cfg = load_config(args.config, args.overrides)
    tokenizer, rows, where = examples(cfg, args.n, args.split)
    color = sys.stdout.isatty()
    print(f"{len(rows)} {args.split} example(s) from {where}; trained tokens "
          + ("in green" if color else "between [[ and ]]"))
    for i, ex in enumerate(rows):
        text = describe(tokenizer, ex, i, color=color, ids=args.ids)
        if color:
            console.print(text, soft_wrap=True, highlight=False)
        else:
            print(text)
    return 0
