"""`scaletrain import llamafactory LF.yaml [-o job.yaml]`, `scaletrain import trl grpo.yaml [-o ...]` (the YAML of
`trl grpo --config`) and `scaletrain import deepspeed ds.json [-o ...]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("import", parents=parents, help="write a scaletrain config from a LLaMA-Factory YAML, a TRL "
                                                       "GRPO YAML or a DeepSpeed JSON, with a table of where each "
                                                       "key went")
    p.add_argument("kind", choices=("llamafactory", "trl", "deepspeed"), help="what the file is")
    p.add_argument("path", help="the LLaMA-Factory training YAML, the `trl grpo --config` YAML, or the DeepSpeed JSON")
    p.add_argument("-o", "--out", help="write the config here (never over an existing file); default: stdout")
    p.set_defaults(func=run)


def _read(path: str, kind: str):
    import yaml

    from scaletrain.errors import ConfigError
    from scaletrain.textfile import read_text

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: file not found; pass the {kind} file to import")
    try:
        text = read_text(p, kind)
        data = json.loads(text) if kind == "DeepSpeed JSON" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: not a valid {kind} ({str(e).splitlines()[0]}); fix the syntax") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a {kind} must be a mapping of keys")
    return data


def _spec_rows(cfg: dict, path: str) -> list:
    """A v1 job's dataset spec file, read where it can be (from here, else beside the YAML's folder): a dataset
    whose rows are not read here stops the import (nothing written); one not found yet is said."""
    from scaletrain.config.importers import CANNOT_RUN, Row
    from scaletrain.data.spec import is_spec, read_spec
    from scaletrain.errors import DataError

    spec = (cfg.get("data") or {}).get("train_file")
    if not spec or not is_spec(spec):
        return []
    found = next((p for p in (Path(spec), Path(path).parent / spec, Path(path).parents[2] / spec
                              if len(Path(path).parents) > 2 else Path(spec)) if p.is_file()), None)
    if found is None:
        return [Row("train_dataset", spec, "data.train_file", "not found from here: read when the job trains (run "
                                                              "it where v1 runs it)")]
    import yaml

    raw = yaml.safe_load(found.read_text(encoding="utf-8"))
    pairs = [name for name, e in (raw or {}).items() if isinstance(e, dict) and e.get("converter") == "pair"]
    said = []
    if pairs:  # v1 trains DPO on what its pair converter gives; here the stage is named
        cfg.setdefault("train", {})["stage"] = "dpo"
        said.append(Row("train_dataset", spec, "train.stage", f"dpo: {', '.join(pairs)} converted by v1's pair "
                                                               f"converter (chosen / rejected conversations)"))
    try:
        entries = read_spec(str(found), "data.train_file")
    except DataError as e:
        if "converter" in str(e):
            return [Row("train_dataset", spec, "", f"{e}; {CANNOT_RUN}")]
        return said + [Row("train_dataset", spec, "data.train_file", f"{e} (said again when the job trains)")]
    return said + [Row("train_dataset", spec, "data.train_file", f"{len(entries)} dataset(s): " + ", ".join(
        f"{e.name} ({e.formatting}{f', {e.size} rows' if e.size else ''})" for e in entries))]


def run(args: argparse.Namespace) -> int:
    import yaml
    from rich.console import Console
    from rich.table import Table

    from scaletrain.config.importers import from_deepspeed, from_llamafactory, looks_like_llamafactory
    from scaletrain.errors import ConfigError

    out = Path(args.out) if args.out else None
    if out is not None and out.exists():
        raise ConfigError(f"-o {out}: the file exists and is never overwritten; choose another name")
    if args.kind == "llamafactory":
        from scaletrain.config.lf_v1 import from_v1, looks_like_v1

        lf = _read(args.path, "LLaMA-Factory YAML")
        v1 = looks_like_v1(lf)
        if not v1 and not looks_like_llamafactory(lf):
            what = ("a scaletrain config already (it has sections: model, data, ...)" if "model" in lf and
                    isinstance(lf.get("model"), dict) else "not a LLaMA-Factory training YAML (it has none of "
                    "model_name_or_path, stage, dataset, finetuning_type, template, or fewer than two; nor v1's "
                    "model, model_class, train_dataset, micro_batch_size, dist_config)")
            raise ConfigError(f"{args.path} is {what}; pass the YAML you give `llamafactory-cli train`")
        ds = ds_path = None
        if v1:
            cfg, rows = from_v1(lf, args.path)
            rows += _spec_rows(cfg, args.path)
        elif lf.get("deepspeed"):
            ds_path = Path(str(lf["deepspeed"]))
            if not ds_path.is_absolute() and not ds_path.is_file():
                ds_path = Path(args.path).parent / ds_path
            ds = _read(str(ds_path), "DeepSpeed JSON")
        if not v1:
            cfg, rows = from_llamafactory(lf, ds, str(ds_path or ""))
    elif args.kind == "trl":
        from scaletrain.config.trl_import import from_trl, looks_like_trl

        raw = _read(args.path, "TRL YAML")
        if not looks_like_trl(raw):
            raise ConfigError(f"{args.path} is not a `trl grpo --config` YAML (it has none of model_name_or_path, "
                              f"reward_funcs, num_generations, dataset_name, max_completion_length, or fewer than "
                              f"two); pass the YAML you give `trl grpo`")
        cfg, rows = from_trl(raw)
    else:
        train, rows = from_deepspeed(_read(args.path, "DeepSpeed JSON"), {}, args.path)
        cfg = {"train": train}
    text = (f"# Written by `scaletrain import {args.kind} {args.path}`; the table it printed says where each key "
            f"went.\n" + yaml.safe_dump(cfg, sort_keys=False))
    table = Table(title=f"scaletrain import {args.kind}: {args.path}")
    for col in ("key", "value", "scaletrain", "note"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r.key, str(r.value), r.where or "[yellow]not mapped[/]", r.note)
    Console(stderr=True, width=max(160, Console(stderr=True).width)).print(table)
    from scaletrain.config.importers import CANNOT_RUN

    if blocked := [r for r in rows if CANNOT_RUN in r.note]:
        raise ConfigError(f"{args.path}: {blocked[0].key}={blocked[0].value}: {blocked[0].note} (the table above says "
                          f"where each key would go); no config written")
    if out is None:
        sys.stdout.write(text)
    else:
        with open(out, "x") as f:  # "x": an existing file is never replaced, even one made since the check
            f.write(text)
        Console(stderr=True).print(f"written: {out} (check it with: scaletrain doctor {out})")
    return 0
