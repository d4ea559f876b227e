"""Prepare a job's data once, in the driver: load, format, render, tokenize (``datasets.map``, batched, in
``data.preprocessing_num_workers`` processes), drop and count what cannot be trained on, mix, split, and save
the tokenized splits as Arrow files that every worker memory-maps.

The result is cached under a fingerprint of everything that changes the tokens (the source files' contents,
the tokenizer, the template, every data key that matters, the task and the seed): the second run of the same
data loads it in well under a second and says so; ``data.overwrite_cache: true`` tokenizes again. A cache
entry is written to a temporary directory and renamed whole, so a crash never leaves half an entry.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from scaletrain.config.schema import Config
from scaletrain.config.stages import RL_STAGES
from scaletrain.data import encode
from scaletrain.data.encoders import encoder_for
from scaletrain.data.fingerprint import CACHE_VERSION, cache_key
from scaletrain.data.images import sources_digest
from scaletrain.data.labels import Labels, resolve_labels
from scaletrain.data.lengths import example_lengths, list_lengths
from scaletrain.data.parts import has_image_parts, images_from_parts
from scaletrain.data.sources import (
    Loaded,
    Source,
    eval_sources,
    exists,
    load,
    sources,
)
from scaletrain.data.spread import Speed, encoded
from scaletrain.data.template_facts import check_template, conversation_notes
from scaletrain.data.template_input import template_variables
from scaletrain.data.templates import TOOL_TEMPLATES, render_advice, resolve_template
from scaletrain.data.turns import CONVERSATION, one_per_turn, per_turn_cost, supervision_note
from scaletrain.data.vision import IMAGE_PROBLEM
from scaletrain.errors import ConfigError, DataError
from scaletrain.storage.mirror import local_output_dir

log = logging.getLogger("scaletrain.data")

# bump when the tokenization of the same inputs changes (3: packed rows name their examples; 4: labels end at the
# end-of-turn token and begin after the generation prompt in every mode)
META = "meta.json"
SHOW_BAD = 5  # record numbers listed per skip reason


@dataclass
class PreparedData:
    train: object  # datasets.Dataset with input_ids, labels
    eval: object
    pad_token_id: int
    train_path: str = ""
    eval_path: str = ""
    cached: bool = False
    skipped: dict = field(default_factory=dict)  # reason -> count
    notes: list = field(default_factory=list)  # what to tell the user (skips, cache hits)
    labels: Labels | None = None  # classification: the classes found in the training data
    stream: object = None  # data.streaming: the StreamSource the workers read (train: the driver's sample of it)

    def resolve(self, cfg: Config) -> Config:
        """The config with what the data decided: ``model.num_labels`` and ``data.label_names``."""
        if self.labels is None:
            return cfg
        names = list(self.labels.names) if self.labels.names else None
        return cfg.model_copy(update={"model": cfg.model.model_copy(update={"num_labels": self.labels.num_labels}),
                                      "data": cfg.data.model_copy(update={"label_names": names})})

    def save(self, out_dir: Path) -> tuple[str, str]:
        """The splits' paths for the workers (the cache entry: Arrow files they memory-map); ``out_dir`` gets a
        record of where they are and what was skipped."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        if not self.eval_path:  # a stream without data.eval_file: its empty eval split
            _materialized(self.eval).save_to_disk(str(out_dir / "eval"), num_shards=1)
            self.eval_path = str(out_dir / "eval")
        if self.stream is not None:
            (out_dir / "stream.json").write_text(json.dumps(self.stream.to_spec(), indent=1))
        (out_dir / "source.json").write_text(json.dumps({"train": self.train_path, "eval": self.eval_path,
                                                         "streaming": self.stream is not None,
                                                         "train_examples": len(self.train),
                                                         "eval_examples": len(self.eval),
                                                         "skipped": self.skipped, "cached": self.cached}, indent=1))
        return self.train_path, self.eval_path


def cached_entry(cfg: Config, tokenizer, image_text=None) -> Path | None:
    """The data cache entry of this config and tokenizer when it exists (what `train` would load), else None."""
    d = cfg.data
    train_sources, eval_srcs = sources(d, cfg.model.task, cfg.train.stage), eval_sources(d, cfg.train.stage)
    template = resolve_template(d.template, tokenizer) if cfg.model.task == "causal-lm" else ("", "")
    for src in train_sources + eval_srcs:
        exists(src)  # a missing file: one line naming its key, as train says it
    media = (sources_digest(train_sources + eval_srcs, d.media_dir, d.encoding) if image_text is not None else "")
    entry = cache_root(cfg) / cache_key(cfg, tokenizer, template[1], train_sources + eval_srcs, media)
    return entry if (entry / META).is_file() else None


def cache_root(cfg: Config) -> Path:
    """Where the job's tokenized data is cached (data.cache_dir, default <output_dir>/.cache/data)."""
    d = cfg.data
    return Path(d.cache_dir or local_output_dir(cfg.output.output_dir, cfg.storage) / ".cache" / "data"
                ).expanduser().resolve()


def prepare_data(cfg: Config, tokenizer, image_text=None) -> PreparedData:
    """Read, split and tokenize both splits once for the whole job (in the driver), or load them from the cache.
    ``image_text``: a vision-language model's factory, called when a source has images (model/processor.py)."""
    import datasets

    d = cfg.data
    train_sources = sources(d, cfg.model.task, cfg.train.stage)
    eval_srcs = eval_sources(d, cfg.train.stage)
    template = resolve_template(d.template, tokenizer) if cfg.model.task == "causal-lm" else ("", "")
    if d.enable_thinking is not None and "enable_thinking" not in template[1]:
        raise ConfigError(f"data.enable_thinking={str(d.enable_thinking).lower()}: the chat template "
                          f"({template[0] or 'none'}) has no thinking switch; remove data.enable_thinking, or use "
                          f"the template of a model that has one (Qwen3's)")
    for src in train_sources + eval_srcs:
        exists(src)
    template_notes = check_template(*template, tokenizer) if template[0] else []
    media = (sources_digest(train_sources + eval_srcs, d.media_dir, d.encoding) if image_text is not None else "")
    entry = cache_root(cfg) / cache_key(cfg, tokenizer, template[1], train_sources + eval_srcs, media)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if (entry / META).is_file() and not d.overwrite_cache:
        meta = json.loads((entry / META).read_text())
        train, evals = datasets.load_from_disk(str(entry / "train")), datasets.load_from_disk(str(entry / "eval"))
        note = (f"data: cache hit, tokenization skipped ({len(train)} train / {len(evals)} eval examples from "
                f"{entry})")
        return PreparedData(train, evals, pad, str(entry / "train"), str(entry / "eval"), True, meta["skipped"],
                            [note, *meta["notes"]], _labels(meta.get("labels")))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="scaletrain-hf-") as hf_cache:
        datasets.disable_progress_bars()
        loaded = [(src, _loaded(src, cfg, hf_cache)) for src in train_sources]
        loaded_evals = [(src, _loaded(src, cfg, hf_cache)) for src in eval_srcs]
        labels = _class_labels(cfg, loaded, loaded_evals[0] if loaded_evals else None)
        # a vision-language job whose data has images: every source through the image path (a text-only source
        # beside them too, LF's mllm_demo,identity: one set of columns to mix and collate)
        if image_text is not None and any(src.columns.images in raw.ds.column_names
                                          for src, raw in loaded + loaded_evals):
            image_text = image_text()
        else:
            image_text = None
        parts, skipped, notes, speed = [], {}, list(template_notes), Speed()
        for src, raw in loaded:
            notes += _placeholders(src, raw)
            ds, why, said = _tokenized(src, raw, cfg, tokenizer, template, labels, hf_cache, speed, image_text)
            parts.append(ds)
            _merge(skipped, notes, why, src, raw)
            notes += said
        train = _mix(parts, cfg)
        if loaded_evals:
            eval_parts = []
            for src, raw in loaded_evals:
                ds, why, said = _tokenized(src, raw, cfg, tokenizer, template, labels, hf_cache, speed, image_text)
                eval_parts.append(ds)
                _merge(skipped, notes, why, src, raw)
                notes += said
            evals = datasets.concatenate_datasets(eval_parts) if len(eval_parts) > 1 else eval_parts[0]
        else:
            train, evals = _split(train, cfg, train_sources[0])
        train, evals = (x.remove_columns([CONVERSATION]) if CONVERSATION in x.column_names else x
                        for x in (train, evals))
        if cfg.train.stage in RL_STAGES:  # a group of rows per prompt: its completions to be
            from scaletrain.data.prompts import groups

            train, evals = groups(train, cfg.rl.num_generations), groups(evals, cfg.rl.num_generations)
        train = train.add_column("length", example_lengths(train))  # for balanced ranks
        if (said := supervision_note(train, cfg)) is not None:
            notes.append(said)
        if d.packing:
            from scaletrain.data.packing import pack

            n = len(train)
            train = pack(train, d.max_length, cfg.train.seed, hf_cache)
            evals = pack(evals, d.max_length, cfg.train.seed, hf_cache) if d.pack_eval else evals
            notes.append(f"data: packed {n} examples into {len(train)} rows of up to {d.max_length} tokens")
        notes.append(f"data: tokenized {len(train)} train {'rows' if d.packing else 'examples'} / {len(evals)} eval in "
                     f"{time.perf_counter() - t0:.1f} s ({speed}); cached as {entry}")
        meta = {"skipped": skipped, "notes": notes[:-1], "version": CACHE_VERSION,
                "labels": labels and {"num_labels": labels.num_labels, "names": labels.names}}
        _write_entry(entry, train, evals, meta)
    train, evals = datasets.load_from_disk(str(entry / "train")), datasets.load_from_disk(str(entry / "eval"))
    return PreparedData(train, evals, pad, str(entry / "train"), str(entry / "eval"), False, skipped, notes, labels)


PLACEHOLDER = re.compile(r"\{\{\s*[A-Za-z_][\w.]*\s*\}\}")


def _placeholders(src: Source, raw: Loaded) -> list[str]:
    """A warning when targets hold ``{{name}}`` text: a template file not yet filled in (LLaMA-Factory's
    identity.json before its {{name}} and {{author}} are replaced) would teach the model the braces."""
    column = {"alpaca": src.columns.response, "sharegpt": src.columns.messages,
              "messages": src.columns.messages}.get(src.formatting)
    if column is None or column not in raw.ds.column_names:
        return []
    found: dict[str, int] = {}
    first = None
    for i, value in enumerate(raw.ds[column]):
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        names = set(PLACEHOLDER.findall(text or ""))
        for name in names:
            found[name] = found.get(name, 0) + 1
        if names and first is None:
            first = raw.position(i)
    if not found:
        return []
    n = max(found.values())
    shown = ", ".join(sorted(found)[:4])
    return [f"data: warning: {src.key}: {n} record(s) hold placeholder text in their targets ({shown}; first at "
            f"{raw.unit} {first}); the model would learn the braces: fill them in (e.g. replace {{{{name}}}} in "
            f"identity.json) or remove those records"]


def _labels(saved: dict | None) -> Labels | None:
    if not saved:
        return None
    return Labels(saved["num_labels"], tuple(saved["names"]) if saved["names"] else None)


def _loaded(src: Source, cfg: Config, hf_cache: str) -> Loaded:
    """The source's records, capped by data.max_samples / its num_samples (before the eval split: a cap is a cap
    of the file)."""
    d = cfg.data
    raw = load(src.path, src.file_format, src.key, hf_cache, d.encoding, src.origin)
    cap = min(n for n in (d.max_samples, src.num_samples, len(raw.ds)) if n)
    if cap < len(raw.ds):
        raw.ds = raw.ds.select(range(cap))
    c = src.columns
    if src.formatting == "messages" and c.messages in raw.ds.column_names and has_image_parts(
            raw.ds.select(range(min(len(raw.ds), 1000))), c.messages, c.content_tag):  # image parts: LF's rows
        raw.ds = raw.ds.map(images_from_parts, fn_kwargs={"messages": c.messages, "content": c.content_tag,
                                                          "images": c.images}, desc=None)
    return raw


def _class_labels(cfg: Config, loaded: list, loaded_eval) -> Labels | None:
    if cfg.model.task != "sequence-classification":
        return None
    column = cfg.data.label_column

    def labels_of(src: Source, raw: Loaded):
        col = raw.ds[column] if column in raw.ds.column_names else []
        return f"{src.key}={src.path}", col

    return resolve_labels(cfg, [labels_of(*x) for x in loaded], labels_of(*loaded_eval) if loaded_eval else None)


def _tokenized(src: Source, raw: Loaded, cfg: Config, tokenizer, template: tuple[str, str], labels: Labels | None,
               workdir: str, speed: Speed, image_text=None):
    """One source's examples (input_ids, labels) and its skipped records: {reason: [positions]} (file lines for
    JSON Lines, record numbers otherwise). Written to an Arrow file in ``workdir`` batch by batch (the driver holds
    no tokenized split in memory)."""
    d = cfg.data
    ds = raw.ds
    fn = encoder_for(ds, src, cfg, tokenizer, template, labels, image_text)
    out = encoded(ds, fn, d, workdir, speed)
    said = []
    if encode.STATS[0] in out.column_names:  # a chat: what its conversations meet in the template, said or refused
        said += conversation_notes(src.key, out, lambda i: f"{raw.unit} {raw.position(i)}", template,
                                   template_variables(tokenizer, d.enable_thinking), d)
        out = out.remove_columns(list(encode.STATS))
    reasons = out["_skip"]
    bad: dict[str, list[int]] = {why: list(rows) for why, rows in raw.bad.items()}  # lines that are not records
    for i, why in enumerate(reasons):
        if why:
            bad.setdefault(why, []).append(raw.position(i))
    n_bad = sum(map(len, bad.values()))
    n_all = len(out) + sum(map(len, raw.bad.values()))
    if encode.NO_TOOL_FORMAT in bad:  # never a silent drop: the model would learn calls to tools it never saw
        rows = bad[encode.NO_TOOL_FORMAT]
        raise DataError(f"{src.key}={src.path}: {len(rows)} records declare or call tools ({raw.unit} {rows[0]} is the "
                        f"first), and data.template={template[0]} has no tool format; use the model's own template "
                        f"(data.template=auto) or a built-in that has one: {', '.join(TOOL_TEMPLATES)}")
    if unreadable := [(p, why) for why, rows in bad.items() if why.startswith(IMAGE_PROBLEM) for p in rows]:
        position, why = min(unreadable)  # never trained without the image its text speaks of
        raise DataError(f"{src.key}={src.path}: {raw.unit} {position}: {why[len(IMAGE_PROBLEM):]}; fix the path "
                        f"(relative paths start at data.media_dir, else the data file's directory) or the file"
                        + (f" ({len(unreadable)} records have unreadable images)" if len(unreadable) > 1 else ""))
    if n_bad and n_bad > d.max_bad_ratio * n_all:
        first_reason = min(bad, key=lambda r: min(bad[r]))
        fix = (render_advice(first_reason, template[0], template[1]) if first_reason.startswith("the chat template")
               else "fix the data or the columns/formatting keys")
        raise DataError(f"{src.key}={src.path}: {n_bad} of {n_all} records cannot be trained on (more than "
                        f"data.max_bad_ratio={d.max_bad_ratio:g}); the first is {raw.unit} {min(bad[first_reason])}"
                        f": {first_reason}; {fix}")
    if n_bad:
        keep = [i for i, why in enumerate(reasons) if not why]
        out = out.select(keep)
    if "turn_input_ids" in out.column_names:  # data.multi_turn: per_turn, once each record is counted
        said.append(per_turn_cost(src.key, out["_full"]))
        out = out.map(partial(one_per_turn, source=src.key), batched=True, with_indices=True,
                      remove_columns=out.column_names, keep_in_memory=True, desc=None)
    said += [cut] if (cut := _cut(src, out, d)) else []
    return out.remove_columns(["_skip", "_full"]), bad, said


def _cut(src: Source, out, d) -> str | None:
    """What data.max_length cut (a note: how many records, the longest, how many lost most of their tokens);
    an error when more than data.max_truncated_ratio of the records lose over half of their tokens."""
    column = "input_ids" if "input_ids" in out.column_names else "chosen_input_ids"  # a pair: its longer side
    lengths = [(f, k) for f, k in zip(out["_full"], list_lengths(out, column).tolist()) if f > k]
    if not lengths:
        return None
    most = sum(1 for f, k in lengths if k < f / 2)
    longest = max(f for f, _ in lengths)
    if most > d.max_truncated_ratio * len(out):
        raise DataError(f"{src.key}={src.path}: {most} of {len(out)} records lose more than half of their tokens to "
                        f"data.max_length={d.max_length} (the longest has {longest}; more than "
                        f"data.max_truncated_ratio={d.max_truncated_ratio:g}); raise data.max_length (cutoff_len) "
                        f"or data.max_truncated_ratio")
    return (f"data: {src.key}: {len(lengths)} of {len(out)} records are longer than data.max_length="
            f"{d.max_length} and were cut (the longest has {longest} tokens; {most} lost more than half)")


def _merge(skipped: dict, notes: list, bad: dict[str, list[int]], src: Source, raw: Loaded) -> None:
    for reason, rows in bad.items():
        rows = sorted(rows)
        skipped[f"{src.name}: {reason}"] = len(rows)
        shown = ", ".join(map(str, rows[:SHOW_BAD])) + (", ..." if len(rows) > SHOW_BAD else "")
        notes.append(f"data: {src.key}: skipped {len(rows)} record(s) that cannot be trained on: {reason} "
                     f"({raw.unit}{'s' if len(rows) > 1 else ''} {shown})")


def _mix(parts: list, cfg: Config):
    import datasets

    if len(parts) == 1:
        return parts[0]
    d = cfg.data
    if d.mix_strategy == "interleave":
        return datasets.interleave_datasets(parts, probabilities=d.mix_probs, seed=cfg.train.seed,
                                            stopping_strategy="first_exhausted")
    return datasets.concatenate_datasets(parts)


def _split(train, cfg: Config, src: Source):
    """Hold out ``eval_ratio`` with a seeded shuffle, so every run of the config holds out the same rows (whole
    conversations under data.multi_turn: per_turn)."""
    d = cfg.data
    groups = train[CONVERSATION] if CONVERSATION in train.column_names else range(len(train))
    members: dict = {}
    for row, group in enumerate(groups):
        members.setdefault(group, []).append(row)
    order = list(members)
    random.Random(cfg.train.seed).shuffle(order)
    n_eval = int(round(len(order) * d.eval_ratio))
    if d.eval_ratio > 0 and n_eval == 0:
        n_eval = 1
    if n_eval >= len(order):
        raise DataError(f"{src.key}={src.path}: {len(order)} record(s) cannot be split with data.eval_ratio="
                        f"{d.eval_ratio}; add data or give data.eval_file")
    rows = lambda part: [r for g in part for r in members[g]]
    return train.select(rows(order[n_eval:])), train.select(rows(order[:n_eval]))


def _write_entry(entry: Path, train, evals, meta: dict) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=entry.parent))
    try:
        for name, split in (("train", train), ("eval", evals)):
            _materialized(split).save_to_disk(str(tmp / name), num_shards=1 if len(split) == 0 else None)
        (tmp / META).write_text(json.dumps(meta, indent=1))
        if entry.exists():  # data.overwrite_cache: the new entry replaces the old one whole
            aside = entry.with_name(f".old-{entry.name}-{os.getpid()}")
            os.replace(entry, aside)
            shutil.rmtree(aside, ignore_errors=True)
        os.replace(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _materialized(split):
    """A split as its own Arrow table (a selection of indices is written out; an empty one keeps its columns)."""
    import datasets

    if len(split) == 0:
        return datasets.Dataset.from_dict({c: [] for c in split.column_names}, features=split.features)
    return split.flatten_indices()
