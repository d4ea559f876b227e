"""Preference pairs (train.stage: dpo): a prompt and two replies, chosen and rejected, in LLaMA-Factory's ranking
formats, rendered with the same templates as SFT (tools included).

``alpaca``: instruction / input (system, history) with ``chosen`` and ``rejected`` reply strings. ``sharegpt``
and ``messages``: the prompt's turns (ending with the user's) with ``chosen`` and ``rejected`` turn objects
(``{"from": "gpt", "value": ...}`` / ``{"role": "assistant", "content": ...}``; a bare string works too).
Each side is rendered as its own conversation; its labels are the last reply only (prompt tokens never count).
Both sides share the prompt's cut: LLaMA-Factory's ``infer_seqlen`` with the longer reply's length, so the
prompt is the same tokens on both sides and each reply keeps the same budget. A pair whose replies are equal
or empty is skipped and counted, as any record that cannot be trained on.
"""

from __future__ import annotations

from typing import Any

from scaletrain.data.encode import (
    IGNORE_INDEX,
    NO_TOOL_FORMAT,
    assistant_mask,
    budget,
    encode_texts,
)
from scaletrain.data.formats import Chat, Columns, to_conversation
from scaletrain.data.template_input import special_tokens
from scaletrain.data.templates import render_records, supports_tools

PAIR_COLUMNS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")
KTO_COLUMNS = ("input_ids", "labels", "prompt_len", "kto_tag")


def _reply(value, c: Columns, formatting: str) -> str | None:
    """A reply's text: a string, a turn object, or a one-turn list."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, dict):
        value = value.get("content" if formatting == "messages" else c.content_tag)
    return value if isinstance(value, str) and value.strip() else None


V1_SIDES = ("chosen_messages", "rejected_messages")  # LLaMA-Factory v1's pairs: two whole conversations


def to_pair(row: dict[str, Any], formatting: str, c: Columns) -> tuple[tuple[Chat, Chat] | None, str]:
    """The chosen and the rejected conversation of a record (the same prompt), or why it is skipped."""
    if formatting == "messages" and all(k in row for k in V1_SIDES):
        return _v1_pair(row, c)
    if formatting == "messages" and all(_whole(row.get(k)) for k in (c.chosen, c.rejected)):  # v1's pair converter
        return _v1_pair({**{k: v for k, v in row.items() if k not in (c.chosen, c.rejected)},
                         V1_SIDES[0]: row[c.chosen], V1_SIDES[1]: row[c.rejected]}, c)
    chosen, rejected = _reply(row.get(c.chosen), c, formatting), _reply(row.get(c.rejected), c, formatting)
    if chosen is None or rejected is None:
        return None, f"empty or missing '{c.chosen if chosen is None else c.rejected}'"
    if chosen == rejected:
        return None, "chosen and rejected are the same reply"
    sides = []
    for reply in (chosen, rejected):
        if formatting == "alpaca":
            side = {**row, c.response: reply}
        else:
            turn = ({"role": "assistant", "content": reply} if formatting == "messages"
                    else {c.role_tag: c.assistant_tag, c.content_tag: reply})
            side = {**row, c.messages: list(row.get(c.messages) or []) + [turn]}
        chat, why = to_conversation(side, formatting, c)
        if chat is None:
            return None, why
        sides.append(chat)
    return (sides[0], sides[1]), ""


def _whole(side) -> bool:
    """A side that is a whole conversation (orca_dpo_pairs' rows, LLaMA-Factory v1's pair converter), not a reply."""
    return isinstance(side, list) and len(side) > 1 and all(isinstance(m, dict) and "role" in m for m in side)


def _v1_pair(row: dict[str, Any], c: Columns) -> tuple[tuple[Chat, Chat] | None, str]:
    """LLaMA-Factory v1's ``chosen_messages`` / ``rejected_messages`` (messages of typed parts, data/parts.py): two
    conversations that share every turn but the last reply."""
    rest = {k: v for k, v in row.items() if k not in V1_SIDES}
    sides = []
    for key in V1_SIDES:
        chat, why = to_conversation({**rest, c.messages: row[key]}, "messages", c)
        if chat is None:
            return None, f"'{key}': {why}"
        sides.append(chat)
    chosen, rejected = sides
    if chosen.messages[:-1] != rejected.messages[:-1]:
        return None, "chosen_messages and rejected_messages differ before their last reply; a pair shares its prompt"
    if chosen.messages[-1] == rejected.messages[-1]:
        return None, "chosen and rejected are the same reply"
    return (chosen, rejected), ""


def encode_pairs(batch: dict[str, list], tokenizer, formatting: str, columns: Columns, template: str,
                 max_length: int) -> dict[str, list]:
    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    pairs, skip = [], []
    tools_ok = supports_tools(template)
    for row in rows:
        pair, why = to_pair(row, formatting, columns)
        if pair is not None and pair[0].uses_tools and not tools_ok:
            pair, why = None, NO_TOOL_FORMAT
        pairs.append(pair)
        skip.append(why)
    good = [i for i, p in enumerate(pairs) if p is not None]
    chats = [side for i in good for side in pairs[i]]
    rendered = render_records([ch.messages for ch in chats], template, special_tokens(tokenizer),
                              [ch.tools for ch in chats])
    out = {k: [[] for _ in rows] for k in PAIR_COLUMNS}
    full = [0] * len(rows)
    for k, i in enumerate(good):
        sides = rendered[2 * k:2 * k + 2]
        if any(isinstance(r, str) for r in sides):
            skip[i] = next(r for r in sides if isinstance(r, str))
            continue
        encodings = encode_texts(tokenizer, [text for text, _ in sides])
        parts = [_split(e.ids, assistant_mask(e.offsets, spans[-1:])) for e, (_, spans) in zip(encodings, sides)]
        (prompt, c_reply, c_mask), (_, r_reply, r_mask) = parts
        full[i] = len(prompt) + max(len(c_reply), len(r_reply))
        n_src, n_tgt = budget(len(prompt), max(len(c_reply), len(r_reply)), max_length)
        for side, reply, mask in (("chosen", c_reply, c_mask), ("rejected", r_reply, r_mask)):
            ids, m = prompt[:n_src] + reply[:n_tgt], [0] * n_src + mask[:n_tgt]
            out[f"{side}_input_ids"][i] = ids
            out[f"{side}_labels"][i] = [t if on else IGNORE_INDEX for t, on in zip(ids, m)]
        if not any(c_mask[:n_tgt]) or not any(r_mask[:n_tgt]):
            skip[i] = f"no trainable token left within data.max_length={max_length} (the prompt fills it)"
    return {**out, "_skip": skip, "_full": full}


def _split(ids: list[int], mask: list[int]) -> tuple[list[int], list[int], list[int]]:
    """(the prompt's tokens, the reply's tokens from its first one to the end, the reply's mask)."""
    first = mask.index(1) if 1 in mask else len(ids)
    return ids[:first], ids[first:], mask[first:]


def _tag(value) -> bool | None:
    """A KTO tag: true/false (LLaMA-Factory writes booleans; "true"/"false" strings and 1/0 are read too)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def encode_kto(batch: dict[str, list], tokenizer, formatting: str, columns: Columns, template: str,
               max_length: int) -> dict[str, list]:
    """KTO's examples (train.stage: kto): a conversation whose last reply is tagged desirable or not; its labels
    are that reply; ``prompt_len`` marks where it starts (the KL term pairs each prompt with another reply)."""
    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    chats, tags, skip = [], [], []
    tools_ok = supports_tools(template)
    for row in rows:
        tag = _tag(row.get(columns.kto_tag))
        chat, why = to_conversation(row, formatting, columns) if tag is not None else (
            None, f"'{columns.kto_tag}' is {row.get(columns.kto_tag)!r}, not true or false")
        if chat is not None and chat.uses_tools and not tools_ok:
            chat, why = None, NO_TOOL_FORMAT
        chats.append(chat)
        tags.append(bool(tag))
        skip.append(why)
    good = [i for i, c in enumerate(chats) if c is not None]
    rendered = render_records([chats[i].messages for i in good], template, special_tokens(tokenizer),
                              [chats[i].tools for i in good])
    out = {k: [[] if k in ("input_ids", "labels") else 0 for _ in rows] for k in KTO_COLUMNS[:3]}
    full = [0] * len(rows)
    for i, r in zip(good, rendered):
        if isinstance(r, str):
            skip[i] = r
            continue
        text, spans = r
        (encoding,) = encode_texts(tokenizer, [text])
        prompt, reply, mask = _split(encoding.ids, assistant_mask(encoding.offsets, spans[-1:]))
        full[i] = len(prompt) + len(reply)
        n_src, n_tgt = budget(len(prompt), len(reply), max_length)
        ids, m = prompt[:n_src] + reply[:n_tgt], [0] * n_src + mask[:n_tgt]
        out["input_ids"][i], out["prompt_len"][i] = ids, n_src
        out["labels"][i] = [t if on else IGNORE_INDEX for t, on in zip(ids, m)]
        if not any(m):
            skip[i] = f"no trainable token left within data.max_length={max_length} (the prompt fills it)"
    return {**out, "kto_tag": tags, "_skip": skip, "_full": full}
