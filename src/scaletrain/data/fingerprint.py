"""The data cache's key: what a prepared split depends on (the cache version, every data key that changes the
tokens, the task, stage and seed, the template, each source's columns and bytes, the tokenizer, the images, and the
tools a GRPO run's prompts declare); the second run of the same job reads the cache, any change writes a new
entry."""

from __future__ import annotations

import hashlib
import json

from scaletrain.config.schema import Config
from scaletrain.config.stages import RL_STAGES
from scaletrain.data.sources import Source, content_hash
from scaletrain.data.tools import load_tools

CACHE_VERSION = 5  # 5: images as references and token counts, never pixels (#73)


def cache_key(cfg: Config, tokenizer, template: str, srcs: list[Source], media: str = "") -> str:
    d = cfg.data
    keys = d.model_dump(exclude={"preprocessing_num_workers", "overwrite_cache", "cache_dir", "loader_workers",
                                 "record_examples", "tokenize_on", "train_file", "eval_file", "dataset_dir"})
    h = hashlib.sha256()
    h.update(json.dumps({"version": CACHE_VERSION, "data": keys, "task": cfg.model.task, "stage": cfg.train.stage,
                         "num_labels": cfg.model.num_labels, "seed": cfg.train.seed, "template": template,
                         "sources": [(s.name, s.formatting, repr(s.columns), s.num_samples, content_hash(s.path))
                                     for s in srcs],
                         "tokenizer": _tokenizer_fingerprint(tokenizer), "media": media,
                         "tools": _declared(cfg)},
                        sort_keys=True, default=str).encode())
    return h.hexdigest()[:20]


def _declared(cfg: Config) -> list[dict] | None:
    """The tools a GRPO run's prompts declare (their schemas are tokens of every prompt)."""
    tools = load_tools(cfg.rl) if cfg.train.stage in RL_STAGES else None
    return tools.schemas if tools else None


def _tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    special = json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str)
    return hashlib.sha256((text + special + str(getattr(tokenizer, "chat_template", ""))).encode()).hexdigest()
