"""Datasets -> tokenized examples -> padded batches.

Tokenization runs once per job in the driver (``prepare_data``); workers load the saved token ids
(``load_split``) and never see a tokenizer or a raw file.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scaletrain.config.schema import Config, DataConfig
from scaletrain.errors import DataError

IGNORE_INDEX = -100  # label value the loss skips (prompt tokens, padding)

ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
ALPACA_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"

_SUFFIX_FORMAT = {".json": "json", ".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def read_records(path: str, fmt: str = "auto", key: str = "data.train_file") -> list[dict[str, Any]]:
    """Read a local JSON (list of objects), JSONL, CSV or Parquet file into a list of dicts."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{key}={path}: file not found; check the path (relative paths are from the working directory)")
    if fmt == "auto":
        fmt = _SUFFIX_FORMAT.get(p.suffix.lower(), "")
        if not fmt:
            raise DataError(f"{key}={path}: cannot tell the format from '{p.suffix}'; set data.format to json, jsonl, csv or parquet")
    try:
        if fmt == "json":
            rows = json.loads(p.read_text())
            if isinstance(rows, dict) and "data" in rows:
                rows = rows["data"]
            if not isinstance(rows, list):
                raise DataError(f"{key}={path}: a JSON file must hold a list of records; use .jsonl for one record per line")
        elif fmt == "jsonl":
            rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        else:
            import pyarrow.csv as pacsv
            import pyarrow.parquet as pq

            table = pacsv.read_csv(p) if fmt == "csv" else pq.read_table(p)
            rows = table.to_pylist()
    except (json.JSONDecodeError, ValueError, OSError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{key}={path}: cannot parse as {fmt}: {str(e).splitlines()[0]}") from None
    if not rows:
        raise DataError(f"{key}={path}: the file has no records; point it at a non-empty file")
    return rows


def _require_columns(rows: list[dict], columns: dict[str, str], key: str, path: str) -> None:
    """``columns`` maps a config key (``text_column``) to the column name it holds."""
    have = set(rows[0])
    for setting, col in columns.items():
        if col not in have:
            raise DataError(
                f"{key}={path}: column '{col}' is missing (columns: {', '.join(sorted(have))}); "
                f"set data.{setting} to one of them"
            )


def tokenize_records(rows: list[dict], cfg: Config, tokenizer, key: str, path: str) -> list[dict]:
    d = cfg.data
    if cfg.model.task == "sequence-classification":
        cols = {"text_column": d.text_column, "label_column": d.label_column}
        if d.text_pair_column:
            cols["text_pair_column"] = d.text_pair_column
        _require_columns(rows, cols, key, path)
        return [_classification_example(r, cfg, tokenizer, key, path) for r in rows]
    _require_columns(rows, {"instruction_column": d.instruction_column, "output_column": d.output_column}, key, path)
    return [_sft_example(r, d, tokenizer) for r in rows]


def _classification_example(row: dict, cfg: Config, tokenizer, key: str, path: str) -> dict:
    d = cfg.data
    pair = row[d.text_pair_column] if d.text_pair_column else None
    enc = tokenizer(str(row[d.text_column]), str(pair) if pair is not None else None,
                    truncation=True, max_length=d.max_length)
    label = row[d.label_column]
    if cfg.model.num_labels == 1:
        label = float(label)
    else:
        label = int(label)
        if not 0 <= label < cfg.model.num_labels:
            raise DataError(f"{key}={path}: label {label} is outside [0, {cfg.model.num_labels}); "
                            f"set model.num_labels to the number of classes")
    return {"input_ids": enc["input_ids"], "labels": label}


def _sft_example(row: dict, d: DataConfig, tokenizer) -> dict:
    extra = str(row.get(d.input_column) or "").strip()
    template = ALPACA_PROMPT_WITH_INPUT if extra else ALPACA_PROMPT
    prompt = template.format(instruction=row[d.instruction_column], input=extra)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(str(row[d.output_column]), add_special_tokens=False)["input_ids"] + [eos]
    ids = (prompt_ids + answer_ids)[: d.max_length]
    # Loss on response tokens only: prompt positions are ignored.
    labels = ([IGNORE_INDEX] * len(prompt_ids) + answer_ids)[: d.max_length]
    return {"input_ids": ids, "labels": labels}


@dataclass
class PreparedData:
    train: list[dict]
    eval: list[dict]
    pad_token_id: int

    def save(self, out_dir: Path) -> tuple[str, str]:
        out_dir.mkdir(parents=True, exist_ok=True)
        train_path, eval_path = out_dir / "train.pt", out_dir / "eval.pt"
        torch.save(self.train, train_path)
        torch.save(self.eval, eval_path)
        return str(train_path), str(eval_path)


def prepare_data(cfg: Config, tokenizer) -> PreparedData:
    """Read, split and tokenize both splits once for the whole job (in the driver)."""
    d = cfg.data
    rows = read_records(d.train_file, d.format, "data.train_file")
    if d.eval_file:
        eval_rows = read_records(d.eval_file, d.format, "data.eval_file")
    else:
        # Split with a seeded shuffle so every run of the config holds out the same rows.
        order = list(range(len(rows)))
        random.Random(cfg.train.seed).shuffle(order)
        n_eval = int(round(len(rows) * d.eval_ratio))
        if d.eval_ratio > 0 and n_eval == 0:
            n_eval = 1
        if n_eval >= len(rows):
            raise DataError(f"data.train_file={d.train_file}: {len(rows)} record(s) cannot be split with "
                            f"data.eval_ratio={d.eval_ratio}; add data or give data.eval_file")
        eval_rows = [rows[i] for i in order[:n_eval]]
        rows = [rows[i] for i in order[n_eval:]]
    if d.max_samples:
        rows = rows[: d.max_samples]
    train = tokenize_records(rows, cfg, tokenizer, "data.train_file", d.train_file)
    evals = tokenize_records(eval_rows, cfg, tokenizer, "data.eval_file" if d.eval_file else "data.train_file",
                             d.eval_file or d.train_file) if eval_rows else []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return PreparedData(train, evals, pad)


class TokenizedDataset(torch.utils.data.Dataset):
    def __init__(self, examples: list[dict]):
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        return self.examples[i]


def load_split(path: str) -> TokenizedDataset:
    return TokenizedDataset(torch.load(path, weights_only=True))


class Collator:
    """Pads a list of examples to the longest one in the batch (right padding)."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(ex["input_ids"]) for ex in batch)
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        seq_labels = isinstance(batch[0]["labels"], list)
        labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long) if seq_labels else None
        for i, ex in enumerate(batch):
            n = len(ex["input_ids"])
            ids[i, :n] = torch.tensor(ex["input_ids"])
            mask[i, :n] = 1
            if seq_labels:
                labels[i, :n] = torch.tensor(ex["labels"])
        if not seq_labels:
            dtype = torch.float if isinstance(batch[0]["labels"], float) else torch.long
            labels = torch.tensor([ex["labels"] for ex in batch], dtype=dtype)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
