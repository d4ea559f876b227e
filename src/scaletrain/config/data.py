"""The `data` section: files or LLaMA-Factory datasets, formats and templates, lengths, packing, hold-out."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import AliasChoices, Field, field_validator, model_validator

from scaletrain.config.base import _Section


class DataConfig(_Section):
    train_file: Optional[str] = Field(None, description=(
        "One training file (or a folder / glob with streaming); or use dataset + dataset_dir."))
    eval_file: Optional[str] = Field(None, description=(
        "A held-out file to evaluate on; unset: eval_ratio of the training data."))
    dataset_dir: Optional[str] = Field(None, description=(
        "Holds dataset_info.json (LLaMA-Factory's) and the files it names."))
    dataset: Optional[list[str]] = Field(None, description=(
        "Names in dataset_info.json to train on (`a,b` works too, as in LLaMA-Factory)."))
    eval_dataset: Optional[list[str]] = Field(None, description=(
        "Names in dataset_info.json to evaluate on (LLaMA-Factory's key)."))
    mix_strategy: Literal["concat", "interleave"] = Field("concat", description=(
        "Several datasets: concat, or interleave (sampled with mix_probs)."))
    mix_probs: Optional[list[float]] = Field(None, description='interleave: the probability of each dataset (seeded).')
    eval_ratio: float = Field(0.1, ge=0, lt=1, description=(
        "Held out from the training data (after max_samples) when eval_file is not given."))
    format: Literal["auto", "json", "jsonl", "csv", "parquet", "arrow", "txt", "webdataset"] = Field(
        "auto", description=("File format; auto: from the suffix (.tar: WebDataset shards); a directory of .tar "
                             "shards is WebDataset, another a datasets save_to_disk directory."))
    formatting: Literal["alpaca", "sharegpt", "messages", "text"] = Field("alpaca", description=(
        "causal-lm: the records' format (LLaMA-Factory's names)."))
    template: str = Field("auto", description=(
        "The chat template that renders records: auto (the tokenizer's own, else alpaca), a built-in name, or a "
        ".jinja file."))
    multi_turn: Literal["spans", "per_turn", "last"] = Field("spans", description=(
        "Which assistant turns of a conversation train: spans (every turn, in one render of the whole conversation), "
        "per_turn (one example per assistant turn: the conversation up to it as the model sees it at inference; "
        "costs more tokens, said at start), last (the last turn only; LLaMA-Factory's mask_history: true)."))
    mask_history: bool = Field(False, description="LLaMA-Factory's name for multi_turn: last.")
    enable_thinking: Optional[bool] = Field(None, description=(
        "LLaMA-Factory's enable_thinking: passed to a chat template that has the switch (Qwen3's); unset: its "
        "default."))
    reasoning: Literal["keep", "drop"] = Field("keep", description=(
        "An assistant turn's reasoning (reasoning_content, thinking, reasoning, or a <think> block in the reply): "
        "keep trains it as the model's chat template writes it (inside the reply as <think>...</think> where the "
        "template has no reasoning of its own, said at start with the count); drop leaves it out of every turn."))
    packing: bool = Field(False, description=(
        "causal-lm: pack examples into rows of max_length tokens (attention never crosses examples)."))
    pack_eval: bool = Field(False, description='Pack the evaluation data too.')
    balance_ranks: bool = Field(True, description=(
        "Without packing: form each step's batches so its ranks hold similar token counts (causal-lm)."))
    train_on_prompt: bool = Field(False, description="Loss on every token, the prompt's too (LLaMA-Factory's name).")
    text_column: str = Field("text", description=(
        "sequence-classification: the text's column (also the text formatting's column)."))
    text_pair_column: Optional[str] = Field(None, description=(
        "sequence-classification: a second text's column (pairs such as NLI)."))
    label_column: str = Field("label", description=(
        "sequence-classification: the label's column (a class number, a class name, or a float for regression)."))
    label_names: Optional[list[str]] = Field(None, description=(
        "Class names in class-id order (labels written as names are sorted when this is not given); written into "
        "final/'s config as id2label/label2id."))
    encoding: str = Field("utf-8", description=(
        "The data files' text encoding (e.g. latin-1); read and converted to UTF-8 before parsing."))
    instruction_column: str = Field("instruction", description="alpaca: the instruction's column.")
    input_column: str = Field("input", description="alpaca: the input's column (appended to the instruction).")
    output_column: str = Field("output", description="alpaca: the reply's column.")
    system_column: str = Field("system", description="alpaca: the system prompt's column.")
    history_column: str = Field("history", description='alpaca: earlier [instruction, reply] pairs.')
    tools_column: str = Field("tools", description=(
        "A JSON list of function schemas the conversation may call (any formatting)."))
    chosen_column: str = Field("chosen", description=(
        "train.stage=dpo/rm: the preferred reply (a string or a turn object)."))
    rejected_column: str = Field("rejected", description='train.stage=dpo/rm: the dispreferred reply.')
    kto_tag_column: str = Field("kto_tag", description=(
        "train.stage=kto: true for a desirable reply, false for an undesirable one."))
    messages_column: Optional[str] = Field(None, description=(
        "sharegpt / messages: the list of turns (default conversations for sharegpt, messages for messages)."))
    role_tag: Optional[str] = Field(None, description="sharegpt / messages: a turn's role key (default from / role).")
    content_tag: Optional[str] = Field(None, description=(
        "sharegpt / messages: a turn's content key (default value / content)."))
    user_tag: Optional[str] = Field(None, description="sharegpt / messages: the user's role (default human / user).")
    assistant_tag: Optional[str] = Field(None, description=(
        "sharegpt / messages: the assistant's role (default gpt / assistant)."))
    observation_tag: Optional[str] = Field(None, description=(
        "sharegpt / messages: a tool result's role (default observation / tool)."))
    function_tag: Optional[str] = Field(None, description=(
        "sharegpt: the tool-call turn's role (default function_call)."))
    images_column: str = Field("images", description=(
        "A vision-language model: each record's images, a list of paths (relative to data.media_dir), absolute "
        "paths or object-storage URIs, one per <image> placeholder in its turns (LLaMA-Factory's column)."))
    media_dir: Optional[str] = Field(None, description=(
        "Where relative image paths start (LLaMA-Factory's name); default: the directory of the data file."))
    image_max_pixels: int = Field(768 * 768, ge=1, description=(
        "An image with more pixels is scaled down to this many before the processor sees it, its aspect kept "
        "(LLaMA-Factory's name and default)."))
    image_min_pixels: int = Field(32 * 32, ge=1, description=(
        "An image with fewer pixels is scaled up to this many (LLaMA-Factory's name and default)."))
    max_length: int = Field(128, ge=8, validation_alias=AliasChoices("max_length", "cutoff_len"), description=(
        "Tokens per example (a packed row with packing); LLaMA-Factory's name cutoff_len works too."))
    max_samples: Optional[int] = Field(None, ge=1, description=(
        "Records kept per dataset, before the eval split; unset: all."))
    max_bad_ratio: float = Field(0.01, ge=0, le=1, description=(
        "Records that cannot be trained on are skipped and counted; more than this share is an error."))
    max_truncated_ratio: float = Field(0.1, ge=0, le=1, description=(
        "Records longer than max_length are cut (said with their count and the longest); more than this share losing "
        "over half of their tokens is an error (the cutoff is probably too small for the data)."))
    preprocessing_num_workers: Optional[int] = Field(None, ge=1, description=(
        "Processes for tokenization on the driver (datasets.map); unset: every core for a source of 20k records or "
        "more."))
    tokenize_on: Literal["auto", "driver", "cluster"] = Field("auto", description=(
        "Where tokenization runs: driver (its cores), cluster (Ray tasks on every node of the cluster the run joins; "
        "data/on_ray.py), auto (the cluster when the driver is already connected to one of several nodes and a "
        "source has 20k records or more)."))
    overwrite_cache: bool = Field(False, description='Tokenize again even if the same data was tokenized before.')
    cache_dir: Optional[str] = Field(None, description=(
        "Where tokenized data is cached; default: <output.output_dir>/.cache/data."))
    loader_workers: int = Field(0, ge=0, description=(
        "DataLoader worker processes per rank (0: load in the training process)."))
    record_examples: bool = Field(False, description=(
        "Each rank writes the ids of the examples every optimizer step trained to <run>/examples/: which data a loss "
        "spike saw, and proof that a resumed run, at any world size, trained each example of the epoch once "
        "(worker/seen.py)."))
    streaming: bool = Field(False, description=(
        "Read the training records from their shards while training (JSON Lines or Parquet: a file, a folder or a "
        "glob, local or s3://), tokenized on the fly, with no prepare step and no copy on disk (data/stream.py); "
        "needs train.max_steps."))
    buffer_size: int = Field(16384, ge=1, description="streaming: the shuffle buffer's records (LLaMA-Factory's name).")

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
    def _image_bounds(self) -> "DataConfig":
        if self.image_min_pixels > self.image_max_pixels:  # which bound wins would be nowhere said
            raise ValueError(f"data.image_min_pixels={self.image_min_pixels} is above data.image_max_pixels="
                             f"{self.image_max_pixels}: an image cannot be both; set image_min_pixels <= "
                             f"image_max_pixels")
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
