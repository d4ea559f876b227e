"""Exactly what trains: an example after templating and truncation with its trained tokens marked, from the
tokenized data itself (the labels the workers read), so what is shown and what trains cannot differ.

Marks: colour on a terminal (rich markup), ``[[...]]`` around trained runs in a log; per example the share of
its tokens that are labels; on request the (label, id) pairs."""

from __future__ import annotations

from itertools import groupby

from scaletrain.data.encode import IGNORE_INDEX

OPEN, CLOSE = "[[", "]]"


def trained_share(labels: list[int]) -> tuple[int, int]:
    """(tokens that are labels, tokens)."""
    return sum(1 for lab in labels if lab != IGNORE_INDEX), len(labels)


def marked(tokenizer, input_ids: list[int], labels: list[int], color: bool = False,
           image_mask: list[int] | None = None) -> str:
    """The example's text, each run of trained tokens marked: decoded run by run (a run of byte-level tokens
    decodes whole, where one token alone could be half a character). ``image_mask`` (1 on a vision-language
    example's image tokens): each image one marker with its token count, ``<image 1: 256 tokens>``."""
    from rich.markup import escape

    parts, images = [], 0
    kinds = image_mask or [0] * len(input_ids)
    runs = groupby(zip(input_ids, labels, kinds), key=lambda p: (p[1] != IGNORE_INDEX, bool(p[2])))
    for (trained, image), run in runs:
        run = list(run)
        if image:
            images += 1
            text = f"<image {images}: {len(run)} tokens>"
            parts.append(f"[bold cyan]{escape(text)}[/]" if color else text)
            continue
        text = tokenizer.decode([tok for tok, _, _ in run])
        if color:
            parts.append(f"[bold green]{escape(text)}[/]" if trained else f"[dim]{escape(text)}[/]")
        else:
            parts.append(f"{OPEN}{text}{CLOSE}" if trained else text)
    return "".join(parts)


def describe(tokenizer, example: dict, index: int, color: bool = False, ids: bool = False) -> str:
    """One example as `preview` prints it (and main.log keeps the first): a header line, the marked text, and the
    (label, id) pairs when asked."""
    input_ids, labels = list(example["input_ids"]), list(example["labels"])
    k, n = trained_share(labels)
    head = f"example {index}: {n} tokens, {k} trained ({100 * k / max(n, 1):.1f}%)"
    body = marked(tokenizer, input_ids, labels, color, _image_mask(tokenizer, example))
    pairs = ("\n(label, id): " + " ".join(f"({lab},{tok})" for tok, lab in zip(input_ids, labels))) if ids else ""
    return f"{head}\n{body}{pairs}"


# The image tokens of the families with images (model/processor.py: Qwen-VL's, Gemma 3's soft token).
IMAGE_TOKENS = ("<|image_pad|>", "<image_soft_token>")


def _image_mask(tokenizer, example: dict) -> list[int] | None:
    """1 on a vision-language example's image tokens (the cache keeps no mask: the collator's is the same rule)."""
    if not example.get("image_tokens"):
        return None
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in IMAGE_TOKENS if t in vocab}
    return [int(t in ids) for t in example["input_ids"]]


def first_example(tokenizer, train) -> str | None:
    """main.log's record of what trains: the first training example, marked (a causal-LM token dataset only)."""
    if len(train) == 0 or not {"input_ids", "labels"} <= set(train.column_names):
        return None
    example = train[0]
    if not isinstance(example["labels"], list):  # a classification label: no token is marked
        return None
    return describe(tokenizer, example, 0)
