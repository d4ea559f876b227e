"""Conversations with images (#62), encoded for a vision-language model in the data step's processes (a batched
``datasets.map`` function, as ``encode.encode_chat`` for text): LLaMA-Factory's rows (``<image>`` placeholders in
the turns, an ``images`` column) become the model's chat template's image parts, each image's size is read from its
header and bounded, its token count taken from the image processor's resize rule, its placeholder replaced by the
text the processor would write (model/processor.py), and the whole tokenized once, with the labels on the replies
as for text.

The cache holds tokens, never pixels (#73): per record its images' references (where each one's bytes are) and
token counts, a few bytes an image where the processed float32 patches were ~11 MB a photo. The pixels are made
while training, in the data-loading workers of the rank that trains on them (data/pixels.py).

Image spans are never cut: truncation (``encode.fit``, LLaMA-Factory's budget) sees each image with its marks as
one token it keeps or drops whole; a record whose images alone do not fit ``data.max_length``, or whose cut would
drop an image, is left out with the reason (counted and named in the data step's lines). A record whose
placeholders and images disagree is left out the same way. An image that cannot be read stops the data step,
naming the record and the image (``IMAGE_PROBLEM``): never a record trained without the image its text speaks of.
"""

from __future__ import annotations

from scaletrain.data.encode import IGNORE_INDEX, STATS, _count, _has_reasoning, assistant_mask, encode_texts, fit
from scaletrain.data.formats import Columns, to_conversation
from scaletrain.data.images import ImageProblem, sized_images
from scaletrain.data.template_input import template_variables, with_reasoning
from scaletrain.data.templates import render_records

PLACEHOLDER = "<image>"  # LLaMA-Factory's image placeholder in a turn's text
IMAGE_PROBLEM = "image: "  # the skip reason's prefix of an unreadable image (prepare.py stops on it)
# The columns a record with images adds to input_ids/labels (data/pixels.py reads them): where each image is (its
# resolved path or URI), Qwen-VL's grids and each image's tokens. The image-token mask is the collator's (input_ids
# == the image token): kept in the cache it would be 8 bytes a token, ~5 KB a photo.
IMAGE_COLUMNS = ("image_refs", "image_grid_thw", "image_tokens")


def encode_vision_chat(batch: dict[str, list], tokenizer, image_text, formatting: str, columns: Columns,
                       template: str, max_length: int, mask_history: bool, train_on_prompt: bool, media_dir: str,
                       max_pixels: int, min_pixels: int, enable_thinking: bool | None = None) -> dict[str, list]:
    """One example per record: ``input_ids``, ``labels``, where its images are (``image_refs``) and, for Qwen-VL,
    their grids; ``image_tokens``: each image's token count."""
    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    variables = template_variables(tokenizer, enable_thinking)
    out = {k: [] for k in ("input_ids", "labels", "_skip", "_full", *IMAGE_COLUMNS, *STATS)}
    for row in rows:
        chat, why = to_conversation(row, formatting, columns)
        refs = row.get(columns.images) or []
        example = None
        if chat is not None and not why:
            example, why = _encode_one(chat.messages, refs, tokenizer, image_text, template, variables, max_length,
                                       mask_history, train_on_prompt, media_dir, max_pixels, min_pixels)
        ids, labels, full, refs, grid, tokens = example or ([], [], 0, [], [], [])
        out["input_ids"].append(ids)
        out["labels"].append(labels)
        out["_skip"].append(why)
        out["_full"].append(full)
        out["image_refs"].append(refs)
        out["image_grid_thw"].append(grid)
        out["image_tokens"].append(tokens)
        out["_turns"].append(_count(chat, lambda m: True))
        out["_reasoned"].append(_count(chat, _has_reasoning))
    return out


def type_column(model_type: str) -> str:
    """The name under which the model takes the 1-on-image-tokens mask: Gemma 3's ``token_type_ids`` (its
    bidirectional attention inside an image), Qwen-VL's ``mm_token_type_ids`` (its M-RoPE positions)."""
    return "token_type_ids" if model_type == "gemma3" else "mm_token_type_ids"


def with_image_parts(messages: list[dict]) -> tuple[list[dict], int]:
    """The messages with each ``<image>`` in a turn's text made an image part (the chat template's own input), and
    how many placeholders there were."""
    n, out = 0, []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str) or PLACEHOLDER not in content:
            out.append(m)
            continue
        parts = []
        for k, piece in enumerate(content.split(PLACEHOLDER)):
            if k:
                parts.append({"type": "image"})
                n += 1
            if piece:
                parts.append({"type": "text", "text": piece})
        out.append({**m, "content": parts})
    return out, n


def _encode_one(messages, refs, tokenizer, image_text, template, variables, max_length, mask_history,
                train_on_prompt, media_dir, max_pixels, min_pixels):
    """(ids, labels, full length, image refs, flat grids, tokens per image), "" or None and why not."""
    loaded, why = _images_of(messages, refs, media_dir, max_pixels, min_pixels)
    if why:
        return None, why
    messages, images = loaded
    counts, grids = _sized(images, image_text)
    tokens, why = _tokens(messages, len(images), counts, tokenizer, image_text, template, variables)
    if why:
        return None, why
    ids, mask, full = tokens
    ids, mask, why = fit_whole(ids, mask, max_length, image_runs(ids, image_text.image_token_id, image_text.marks),
                               keep_last=mask_history)
    if why:
        return None, why
    if mask_history:  # the loss on the last reply only
        mask = _last_reply(mask)
    labels = list(ids) if train_on_prompt else [t if m else IGNORE_INDEX for t, m in zip(ids, mask)]
    if train_on_prompt:
        labels = [IGNORE_INDEX if t == image_text.image_token_id else t for t in labels]
    if not any(lab != IGNORE_INDEX for lab in labels):
        return None, f"no trainable token left within data.max_length={max_length} (the prompt fills it)"
    return (ids, labels, full, [where for where, _ in images], grids, counts), ""


def _sized(images: list[tuple[str, tuple[int, int]]], image_text) -> tuple[list[int], list[int]]:
    """(tokens per image, Qwen-VL's grids end to end) of a record's bounded image sizes."""
    sized = [image_text.sized(*size) for _, size in images]
    return [tokens for tokens, _ in sized], [n for _, grid in sized for n in grid]


def _images_of(messages, refs, media_dir, max_pixels, min_pixels):
    """((the messages with image parts, each image's (where, bounded size)), "") or (None, why)."""
    if not isinstance(refs, (list, tuple)):
        refs = [refs]
    messages, n_placeholders = with_image_parts(messages)
    if n_placeholders != len(refs):
        return None, (f"its turns have {n_placeholders} {PLACEHOLDER} placeholder(s) and its images column "
                      f"{len(refs)} image(s); they must agree (one {PLACEHOLDER} per image, in order)")
    try:
        return (messages, sized_images(list(refs), media_dir, max_pixels, min_pixels)), ""
    except ImageProblem as e:
        return None, f"{IMAGE_PROBLEM}{e}"


def _tokens(messages, n_images, counts, tokenizer, image_text, template, variables):
    """((ids, assistant mask with image tokens off, length), "") of a conversation with its images expanded, or
    (None, why)."""
    rendered = render_records([with_reasoning(messages, template)], template, variables)[0]
    if isinstance(rendered, str):
        return None, rendered
    text, spans = rendered
    text, spans, written = _expanded(text, spans, image_text.placeholder,
                                     [image_text.replacement(t) for t in counts])
    if written != n_images:
        return None, (f"the chat template wrote {written} image placeholder(s) for its {n_images} image(s); use "
                      f"the model's own chat template (data.template: auto)")
    (encoding,) = encode_texts(tokenizer, [text])
    ids = list(encoding.ids)
    mask = [0 if t == image_text.image_token_id else m for t, m in zip(ids, assistant_mask(encoding.offsets, spans))]
    return (ids, mask, len(ids)), ""


def _last_reply(mask: list[int]) -> list[int]:
    from scaletrain.data.encode import _runs

    replies = [r for r in _runs(mask) if r[0]]
    return [1 if replies and replies[-1][1] <= t < replies[-1][2] else 0 for t in range(len(mask))]


def encode_vision_pairs(batch: dict[str, list], tokenizer, image_text, formatting: str, columns: Columns,
                        template: str, max_length: int, media_dir: str, max_pixels: int,
                        min_pixels: int) -> dict[str, list]:
    """Preference pairs with images (train.stage: dpo; LLaMA-Factory's rlhf_v shape): the prompt's images once per
    record, each side (the prompt with its chosen or rejected reply) rendered and expanded as for SFT, its labels
    the last reply only; image spans never cut (each side fitted as ``fit_whole``)."""
    from scaletrain.data.pairs import PAIR_COLUMNS, to_pair

    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    variables = template_variables(tokenizer, None)
    out = {k: [] for k in (*PAIR_COLUMNS, "_skip", "_full", *IMAGE_COLUMNS)}
    for row in rows:
        pair, why = to_pair(row, formatting, columns)
        sides, example = [], None
        if pair is not None:
            loaded, why = _images_of(pair[0].messages, row.get(columns.images) or [], media_dir, max_pixels,
                                     min_pixels)
        if pair is not None and not why:
            _, images = loaded
            counts, grids = _sized(images, image_text)
            for chat in pair:
                messages, _ = with_image_parts(chat.messages)
                tokens, why = _tokens(messages, len(images), counts, tokenizer, image_text, template, variables)
                if why:
                    break
                ids, mask, _ = tokens
                runs = image_runs(ids, image_text.image_token_id, image_text.marks)
                ids, mask, why = fit_whole(ids, _last_reply(mask), max_length, runs, keep_last=True)
                if why:
                    break
                if not any(mask):
                    why = f"no trainable token left within data.max_length={max_length} (the prompt fills it)"
                    break
                sides.append((ids, [t if m else IGNORE_INDEX for t, m in zip(ids, mask)]))
            example = ([where for where, _ in images], grids, counts) if not why else None
        (c_ids, c_labels), (r_ids, r_labels) = sides if example else (([], []), ([], []))
        refs, grid, tokens = example or ([], [], [])
        for key, value in (("chosen_input_ids", c_ids), ("chosen_labels", c_labels), ("rejected_input_ids", r_ids),
                           ("rejected_labels", r_labels), ("_skip", why), ("_full", max(len(c_ids), len(r_ids))),
                           ("image_refs", refs), ("image_grid_thw", grid), ("image_tokens", tokens)):
            out[key].append(value)
    return out


def _expanded(text: str, spans: list[tuple[int, int]], placeholder: str, replacements: list[str]):
    """The text with the k-th ``placeholder`` replaced by ``replacements[k]``, the spans moved with it, and how many
    placeholders the text had (as transformers' ``ProcessorMixin.get_text_with_replacements``, with the offsets)."""
    pieces, shifts, last, written = [], [], 0, 0
    at = text.find(placeholder)
    while at >= 0:
        if written < len(replacements):
            pieces += [text[last:at], replacements[written]]
            shifts.append((at, len(replacements[written]) - len(placeholder)))
            last = at + len(placeholder)
        written += 1
        at = text.find(placeholder, at + len(placeholder))
    pieces.append(text[last:])

    def moved(p: int) -> int:
        return p + sum(d for start, d in shifts if start < p)

    return "".join(pieces), [(moved(a), moved(b)) for a, b in spans], written


def image_runs(ids: list[int], image_id: int, marks: tuple[int, ...]) -> list[tuple[int, int]]:
    """[start, end) of each image's tokens with the marks written around them (kept whole)."""
    runs, i = [], 0
    while i < len(ids):
        if ids[i] != image_id:
            i += 1
            continue
        j = i
        while j < len(ids) and ids[j] == image_id:
            j += 1
        start = i - 1 if i > 0 and ids[i - 1] in marks else i
        end = j + 1 if j < len(ids) and ids[j] in marks else j
        runs.append((start, end))
        i = j
    return runs


def fit_whole(ids: list[int], mask: list[int], cutoff: int, runs: list[tuple[int, int]], keep_last: bool = False):
    """``encode.fit`` with each image run one token that is kept or dropped whole: (ids, mask, "") or (None, None,
    why) when the images alone do not fit or the cut would drop one."""
    if len(ids) <= cutoff:
        return ids, mask, ""
    inside = sum(e - s for s, e in runs)
    if inside >= cutoff:
        return None, None, (f"its {len(runs)} image(s) alone are {inside} tokens, over data.max_length={cutoff} "
                            f"(image tokens are never cut); raise data.max_length or lower data.image_max_pixels")
    collapsed, cmask, k, i = [], [], 0, 0
    while i < len(ids):
        if k < len(runs) and i == runs[k][0]:
            collapsed.append(-(k + 1))  # one stand-in token per image run (ids are never negative)
            cmask.append(0)
            i = runs[k][1]
            k += 1
        else:
            collapsed.append(ids[i])
            cmask.append(mask[i])
            i += 1
    kept, kept_mask = fit(collapsed, cmask, cutoff - inside + len(runs), keep_last)
    present = {-t - 1 for t in kept if t < 0}
    if len(present) != len(runs):
        first = min(set(range(len(runs))) - present) + 1
        return None, None, (f"data.max_length={cutoff} leaves no room for its image {first} (image tokens are never "
                            f"cut); raise data.max_length or lower data.image_max_pixels")
    out_ids, out_mask = [], []
    for t, m in zip(kept, kept_mask):
        if t < 0:
            s, e = runs[-t - 1]
            out_ids += ids[s:e]
            out_mask += [0] * (e - s)
        else:
            out_ids.append(t)
            out_mask.append(m)
    return out_ids, out_mask, ""


def prompt_inputs(messages: list[dict], tokenizer, image_text, images: list) -> dict:
    """A generation prompt with images (``<image>`` placeholders in the turns, ``images`` decoded, in order) as
    the model takes it: the same rendering and expansion as training (``chat --image``, ``eval`` with images)."""
    import torch

    messages, n = with_image_parts(messages)
    if n != len(images):
        raise ValueError(f"{n} {PLACEHOLDER} placeholder(s) for {len(images)} image(s)")
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    processed = image_text.preprocess(images) if images else {"tokens": []}
    text, _, _ = _expanded(text, [], image_text.placeholder, [image_text.replacement(t) for t in processed["tokens"]])
    ids = torch.tensor([encode_texts(tokenizer, [text])[0].ids])
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
           type_column(image_text.model_type): (ids == image_text.image_token_id).long()}
    if images:
        out["pixel_values"] = torch.as_tensor(processed["pixel_values"])
        if "image_grid_thw" in processed:
            out["image_grid_thw"] = torch.as_tensor(processed["image_grid_thw"])
    return out
