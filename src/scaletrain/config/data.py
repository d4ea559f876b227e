"""The `data` section: files or LLaMA-Factory datasets, formats and templates, lengths, packing, hold-out."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import AliasChoices, Field, field_validator, model_validator

from scaletrain.config.base import _Section


class DataConfig(_Section):
    # One file (train_file, optional eval_file), or named datasets of a LLaMA-Factory dataset_info.json.
    train_file: Optional[str] = None
    eval_file: Optional[str] = None
    dataset_dir: Optional[str] = None  # holds dataset_info.json and the files it names
    dataset: Optional[list[str]] = None  # names in dataset_info.json ("a,b" works too, as in LLaMA-Factory)
    eval_dataset: Optional[list[str]] = None  # names in dataset_info.json to evaluate on (LLaMA-Factory's key)
    mix_strategy: Literal["concat", "interleave"] = "concat"
    mix_probs: Optional[list[float]] = None  # interleave: the probability of each dataset (seeded)
    # Held out from the training data (after max_samples) when eval_file is not given.
    eval_ratio: float = Field(0.1, ge=0, lt=1)
    # File format; auto: from the suffix (a directory is a datasets save_to_disk directory).
    format: Literal["auto", "json", "jsonl", "csv", "parquet", "arrow", "txt"] = "auto"
    # causal-lm: the records' format (LLaMA-Factory's names) and the chat template that renders them.
    formatting: Literal["alpaca", "sharegpt", "messages", "text"] = "alpaca"
    template: str = "auto"  # auto (the tokenizer's own, else alpaca), a built-in name, or a .jinja file
    # Which assistant turns of a multi-turn conversation train: spans (every turn, in the one render of the whole
    # conversation with the model's own template, also where it writes the history differently from the last turn,
    # as Qwen3's does), per_turn (one example per assistant turn: the conversation up to it as the model sees it
    # at inference, the loss on that turn; costs more tokens, said at start), last (the last turn only;
    # LLaMA-Factory's mask_history: true means the same).
    multi_turn: Literal["spans", "per_turn", "last"] = "spans"
    mask_history: bool = False  # LLaMA-Factory's name for multi_turn: last
    # LLaMA-Factory's enable_thinking: passed to a chat template that has the switch (Qwen3's); unset: its default.
    enable_thinking: Optional[bool] = None
    # causal-lm: pack examples into rows of max_length tokens (attention never crosses examples); eval too with
    # pack_eval. Without packing, balance_ranks forms each step's batches so its ranks hold similar token counts
    # (causal-lm).
    packing: bool = False
    pack_eval: bool = False
    balance_ranks: bool = True
    train_on_prompt: bool = False  # loss on every token
    # sequence-classification columns
    text_column: str = "text"
    text_pair_column: Optional[str] = None
    label_column: str = "label"
    # Class names in class-id order (labels written as names are sorted when this is not given); written into
    # final/'s config as id2label/label2id.
    label_names: Optional[list[str]] = None
    encoding: str = "utf-8"  # of the data files (e.g. latin-1); read and converted to UTF-8 before parsing
    # causal-lm columns (alpaca; "text" formatting reads text_column)
    instruction_column: str = "instruction"
    input_column: str = "input"
    output_column: str = "output"
    system_column: str = "system"
    history_column: str = "history"
    tools_column: str = "tools"  # a JSON list of function schemas the conversation may call (any formatting)
    chosen_column: str = "chosen"  # train.stage=dpo: the preferred reply (a string or a turn object)
    rejected_column: str = "rejected"
    kto_tag_column: str = "kto_tag"  # train.stage=kto: true for a desirable reply, false for an undesirable one
    # sharegpt / messages: the list of turns and its tags (defaults: conversations/from/value/human/gpt for
    # sharegpt, messages/role/content/user/assistant for messages)
    messages_column: Optional[str] = None
    role_tag: Optional[str] = None
    content_tag: Optional[str] = None
    user_tag: Optional[str] = None
    assistant_tag: Optional[str] = None
    observation_tag: Optional[str] = None
    function_tag: Optional[str] = None  # sharegpt's tool-call turn (default function_call)
    # Tokens per example; LLaMA-Factory's name cutoff_len works too.
    max_length: int = Field(128, ge=8, validation_alias=AliasChoices("max_length", "cutoff_len"))
    max_samples: Optional[int] = Field(None, ge=1)  # per dataset, before the eval split
    # Records that cannot be trained on are skipped and counted; more than this share is an error.
    max_bad_ratio: float = Field(0.01, ge=0, le=1)
    # Records longer than max_length are cut (said with their count and the longest); more than this share losing
    # over half of their tokens is an error (the cutoff is probably too small for the data).
    max_truncated_ratio: float = Field(0.1, ge=0, le=1)
    # Processes for tokenization on the driver (datasets.map); unset: every core for a source of 20k records or more.
    preprocessing_num_workers: Optional[int] = Field(None, ge=1)
    # Where tokenization runs: driver (its cores), cluster (Ray tasks on every node of the cluster the run joins;
    # data/on_ray.py), auto (the cluster when the driver is already connected to one of several nodes and a source
    # has 20k records or more).
    tokenize_on: Literal["auto", "driver", "cluster"] = "auto"
    overwrite_cache: bool = False  # tokenize again even if the same data was tokenized before
    cache_dir: Optional[str] = None  # tokenized data; default: <output.output_dir>/.cache/data
    loader_workers: int = Field(0, ge=0)
    # Each rank writes the ids of the examples every optimizer step trained (their rows in the tokenized split; a
    # packed row's members) to <run>/examples/: which data a loss spike saw, and proof that a resumed run, at any
    # world size, trained each example of the epoch once (worker/seen.py).
    record_examples: bool = False
    # Read the training records from their shards while training (JSON Lines or Parquet: a file, a folder or a
    # glob, local or s3://), tokenized on the fly, with no prepare step and no copy on disk (data/stream.py);
    # needs train.max_steps. buffer_size: the shuffle buffer's records (LLaMA-Factory's names for both).
    streaming: bool = False
    buffer_size: int = Field(16384, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _one_length(cls, data):
        if isinstance(data, dict) and "cutoff_len" in data and "max_length" in data:
            raise ValueError(f"data.cutoff_len={data['cutoff_len']} and data.max_length={data['max_length']} are "
                             f"the same setting (cutoff_len is LLaMA-Factory's name for it); keep one")
        return data

    @field_validator("dataset", "eval_dataset", mode="before")
    @classmethod
    def _names(cls, v):
        if isinstance(v, str):
            return [n.strip() for n in v.split(",") if n.strip()]
        return v

    @field_validator("label_names")
    @classmethod
    def _label_names(cls, v):
        if v is not None:
            if len(v) < 2:
                raise ValueError("needs at least two class names (one is regression: set model.num_labels: 1)")
            twice = sorted({n for n in v if v.count(n) > 1})
            if twice:
                raise ValueError(f"names {', '.join(twice)} more than once; give each class once")
        return v

    @field_validator("encoding")
    @classmethod
    def _encoding(cls, v):
        import codecs

        try:
            return codecs.lookup(v).name
        except LookupError:
            raise ValueError(f"{v!r} is not a text encoding Python knows; use e.g. utf-8, latin-1, cp1252, "
                             f"utf-16") from None

    @model_validator(mode="after")
    def _multi_turn(self) -> "DataConfig":
        if self.mask_history and self.multi_turn == "per_turn":
            raise ValueError("data.mask_history=true (LLaMA-Factory's name for multi_turn: last) contradicts "
                             "data.multi_turn=per_turn; keep one of them")
        if self.mask_history and self.multi_turn != "last":
            self.multi_turn = "last"  # the same setting under LLaMA-Factory's name
        return self

    @model_validator(mode="after")
    def _streaming(self) -> "DataConfig":
        if not self.streaming:
            return self
        given = self.model_fields_set
        refused = {"packing": self.packing and "packing plans need every example's length first",
                   "balance_ranks": "balance_ranks" in given and self.balance_ranks and (
                       "length balancing sorts a window of the whole set"),
                   "eval_ratio": "eval_ratio" in given and self.eval_ratio > 0 and (
                       "a hold-out needs the whole set; give data.eval_file"),
                   "multi_turn": self.multi_turn == "per_turn" and "per_turn makes several examples of a record",
                   "max_samples": self.max_samples is not None and (
                       "a cap of the file counts its records; train.max_steps sets how much of the stream trains")}
        for key, why in refused.items():
            if why:
                raise ValueError(f"data.streaming=true with data.{key}={getattr(self, key)}: {why}; remove "
                                 f"data.{key} or data.streaming")
        if self.dataset and len(self.dataset) > 1:
            raise ValueError(f"data.streaming=true reads one source, and data.dataset names {len(self.dataset)} "
                             f"({', '.join(self.dataset)}); stream one (a folder or glob of its shards)")
        if self.balance_ranks:  # not given: what streaming cannot do (said at start)
            self.balance_ranks = False
        if self.eval_ratio:
            self.eval_ratio = 0.0
        return self

    @model_validator(mode="after")
    def _source(self) -> "DataConfig":
        if not self.train_file and not self.dataset:
            raise ValueError("data.train_file is required (or data.dataset with data.dataset_dir); set one")
        if self.train_file and self.dataset:
            raise ValueError("data.train_file and data.dataset are both set; keep one of them")
        if self.dataset and not self.dataset_dir:
            raise ValueError("data.dataset needs data.dataset_dir (the folder of its dataset_info.json); set it")
        if self.eval_dataset and not self.dataset_dir:
            raise ValueError("data.eval_dataset needs data.dataset_dir (the folder of its dataset_info.json); set it")
        if self.eval_dataset and self.eval_file:
            raise ValueError("data.eval_file and data.eval_dataset are both set; keep one of them")
        if self.mix_probs is not None:
            if self.mix_strategy != "interleave":
                raise ValueError("data.mix_probs applies to data.mix_strategy=interleave only; set it or remove "
                                 "mix_probs")
            if len(self.mix_probs) != len(self.dataset or []) or abs(sum(self.mix_probs) - 1) > 1e-6:
                raise ValueError(f"data.mix_probs={self.mix_probs} needs one probability per dataset "
                                 f"({len(self.dataset or [])}), summing to 1")
        return self
