"""Batched tokenization (run by ``datasets.map``): classification examples, chat conversations, plain text.

Every function takes a batch (a dict of columns) and returns ``input_ids``, ``labels`` and ``_skip`` (why an
example cannot be trained on, "" if it can): the caller counts and drops the skipped ones, so nothing is
trained on silently changed.
"""

from __future__ import annotations

import bisect
import math

from scaletrain.data.formats import NOT_TRAINED, REASONING, Columns, to_conversation
from scaletrain.data.template_input import template_variables, with_reasoning
from scaletrain.data.templates import render_records, supports_tools

IGNORE_INDEX = -100  # label value the loss skips (prompt tokens, padding)


def encode_classification(batch: dict[str, list], tokenizer, text: str, pair: str | None, label: str,
                          max_length: int, regression: bool, label2id: dict[str, int] | None = None
                          ) -> dict[str, list]:
    """A null or empty text and a label that is missing, not a class (a number, or a name of ``label2id``) or
    not a finite number (regression) are skipped with the reason, never trained on as "None" or a truncated
    int."""
    skip = [_text_problem(t, text) or (_text_problem(p, pair) if pair else "") or
            (_name_problem(y, label2id) if label2id else _label_problem(y, regression))
            for t, p, y in zip(batch[text], batch[pair] if pair else batch[text], batch[label])]
    clean = lambda values: [v if not why else "" for v, why in zip(values, skip)]
    texts, pairs = clean(batch[text]), clean(batch[pair]) if pair else None
    enc = tokenizer(texts, pairs, truncation=True, max_length=max_length)
    full = [len(ids) for ids in tokenizer(texts, pairs)["input_ids"]]  # what truncation cut: said, never silent
    as_label = (lambda y: label2id[y]) if label2id else (float if regression else int)
    labels = [as_label(y) if not why else (0.0 if regression else 0) for y, why in zip(batch[label], skip)]
    return {"input_ids": enc["input_ids"], "labels": labels, "_skip": skip, "_full": full}


def _name_problem(value, label2id: dict[str, int]) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        return "missing label"
    if not isinstance(value, str):
        return f"label {value!r} is a number among class names"
    return "" if value in label2id else f"label {value!r} is not a known class"


def _text_problem(value, column: str) -> str:
    if not isinstance(value, str) or not value.strip():
        return f"empty or missing '{column}'"
    return ""


def _label_problem(value, regression: bool) -> str:
    if value is None:
        return "missing label"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"label {value!r} is not a number" + ("" if regression else " among class numbers")
    if not math.isfinite(value):
        return f"label {value} is not a finite number"
    if not regression and value != int(value):
        return f"label {value} is not a whole class number (for a real-valued target set model.num_labels: 1)"
    return ""


def encode_text(batch: dict[str, list], tokenizer, column: str, max_length: int) -> dict[str, list]:
    """Continued pre-training: the text, its EOS, loss on every token."""
    ids, skip, full = [], [], []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for value in batch[column]:
        text = value.strip() if isinstance(value, str) else ""
        skip.append("" if text else f"empty or missing '{column}'")
        whole = tokenizer(text)["input_ids"] + eos if text else []
        full.append(len(whole))
        ids.append(whole[:max_length])
    return {"input_ids": ids, "labels": ids, "_skip": skip, "_full": full}


# The skip reason of a record with tools under a template that has no tool format (prepare makes it an error).
NO_TOOL_FORMAT = "declares or calls tools, and the chat template has no tool format"


def encode_chat(batch: dict[str, list], tokenizer, formatting: str, columns: Columns, template: str,
                template_name: str, max_length: int, mask_history: bool, train_on_prompt: bool,
                enable_thinking: bool | None = None, per_turn: bool = False,
                drop_reasoning: bool = False) -> dict[str, list]:
    """One example per conversation (``input_ids``, ``labels``); with ``per_turn`` one per assistant turn, each
    the render of the conversation up to that turn with the loss on that turn only, returned per conversation
    as lists (``turn_input_ids``, ``turn_labels``, ``_full`` per turn) for the caller to flatten once the
    skipped records are counted by their own position. ``drop_reasoning`` (data.reasoning: drop): every assistant
    turn without its reasoning (counted first, for the note that says so)."""
    from scaletrain.data.template_facts import facts

    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    chats, skip = [], []
    tools_ok = supports_tools(template)
    variables = template_variables(tokenizer, enable_thinking)
    for row in rows:
        chat, why = to_conversation(row, formatting, columns)
        if chat is not None and chat.uses_tools and not tools_ok:
            chat, why = None, NO_TOOL_FORMAT
        elif chat is not None and _most_calls(chat.messages) > 1 and facts(template, variables).one_call_per_message:
            chat, why = None, ONE_CALL
        chats.append(chat)
        skip.append(why)
    stats = {"_turns": [_count(c, lambda m: True) for c in chats],
             "_reasoned": [_count(c, _has_reasoning) for c in chats]}
    if drop_reasoning:
        for c in chats:
            if c is not None:
                c.messages = [without_reasoning(m) if m.get("role") == "assistant" else m for m in c.messages]
    good = [i for i, c in enumerate(chats) if c is not None]
    # (record, the messages rendered): the whole conversation, or (per_turn) what the model sees up to each reply
    units = [(i, m) for i in good for m in (turn_prefixes(chats[i].messages) if per_turn else [chats[i].messages])]
    rendered = render_records([with_reasoning(m, template) for _, m in units], template, variables,
                              [chats[i].tools for i, _ in units])
    for (i, _), r in zip(units, rendered):
        if isinstance(r, str) and not skip[i]:
            skip[i] = r  # a record one of whose renders fails is skipped whole: no turn of it trains unseen
    keep = [k for k, (i, _) in enumerate(units) if not skip[i]]
    encodings = dict(zip(keep, encode_texts(tokenizer, [rendered[k][0] for k in keep])))
    examples: dict[int, list[tuple[list[int], list[int], int]]] = {i: [] for i in range(len(chats))}
    for k in keep:
        i, encoding = units[k][0], encodings[k]
        spans, why = trained_spans(units[k][1], rendered[k][1])
        if why and not skip[i]:
            skip[i] = why
        ids, mask = fit(encoding.ids, assistant_mask(encoding.offsets, spans), max_length,
                        keep_last=mask_history or per_turn)
        if mask_history or per_turn:  # the loss on the last assistant turn only
            runs = [r for r in _runs(mask) if r[0]]
            mask = [1 if runs and runs[-1][1] <= t < runs[-1][2] else 0 for t in range(len(mask))]
        labels = list(ids) if train_on_prompt else [tok if m else IGNORE_INDEX for tok, m in zip(ids, mask)]
        if not any(mask) and not (train_on_prompt and ids) and not skip[i]:
            skip[i] = f"no trainable token left within data.max_length={max_length} (the prompt fills it)"
        examples[i].append((ids, labels, len(encoding.ids)))
    for i, why in enumerate(skip):
        if why:
            examples[i] = []
    if per_turn:
        return {"turn_input_ids": [[e[0] for e in examples[i]] for i in range(len(chats))],
                "turn_labels": [[e[1] for e in examples[i]] for i in range(len(chats))],
                "_skip": skip, "_full": [[e[2] for e in examples[i]] for i in range(len(chats))], **stats}
    first = [examples[i][0] if examples[i] else ([], [], 0) for i in range(len(chats))]
    return {"input_ids": [e[0] for e in first], "labels": [e[1] for e in first], "_skip": skip,
            "_full": [e[2] for e in first], **stats}


# The skip reason of a message with several calls under a template that writes only the first (gpt-oss's).
ONE_CALL = ("an assistant message makes several calls, and the chat template writes only the first (one call per "
            "message, gpt-oss's rule); split them: one call per assistant message, each followed by its result")
STATS = ("_turns", "_reasoned")  # per record: its assistant turns, and those with reasoning (prepare.py's notes)


def _count(chat, which) -> int:
    return 0 if chat is None else sum(1 for m in chat.messages if m.get("role") == "assistant" and which(m))


def _has_reasoning(m: dict) -> bool:
    content = m.get("content")
    return bool(m.get(REASONING)) or (isinstance(content, str) and bool(
        content.split("</think>")[0].split("<think>")[-1].strip()) and "</think>" in content)


def without_reasoning(m: dict) -> dict:
    """An assistant turn without its reasoning: the field, and a think block at the start of the reply."""
    out = {k: v for k, v in m.items() if k != REASONING}
    content = out.get("content")
    if isinstance(content, str) and "</think>" in content and not content.split("</think>")[0].split(
            "<think>")[0].strip():
        out["content"] = content.split("</think>", 1)[1].lstrip("\n")
    return out


def _most_calls(messages: list[dict]) -> int:
    return max((len(m.get("tool_calls") or []) for m in messages), default=0)


def turn_prefixes(messages: list[dict]) -> list[list[dict]]:
    """The conversation up to and including each assistant turn (data.multi_turn: per_turn)."""
    return [messages[:k + 1] for k, m in enumerate(messages) if m.get("role") == "assistant"]


def encode_texts(tokenizer, texts: list[str]):
    """Token ids and character offsets of each text, as ``tokenizer(texts, add_special_tokens=False)`` gives them
    (the fast tokenizer's Rust encoder, called directly: the Python wrapper's per-text conversion of its output
    costs a third of the encoding itself here)."""
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (Python) tokenizer
        enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [_Encoding(i, o) for i, o in zip(enc["input_ids"], enc["offset_mapping"])]
    backend.no_truncation()
    backend.no_padding()
    return backend.encode_batch(texts, add_special_tokens=False)


class _Encoding:
    def __init__(self, ids, offsets):
        self.ids, self.offsets = ids, offsets


def trained_spans(messages: list[dict], spans: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], str]:
    """The assistant spans the loss is on: every one but those of turns the data leaves out (``NOT_TRAINED``,
    LLaMA-Factory v1's loss_weight 0), matched to the assistant turns in order; or why they cannot be matched."""
    replies = [m for m in messages if m.get("role") == "assistant"]
    if not any(m.get(NOT_TRAINED) for m in replies):
        return spans, ""
    if len(spans) != len(replies):
        return spans, (f"loss_weight 0 on an assistant turn: the template marks {len(spans)} reply span(s) for "
                       f"{len(replies)} assistant turn(s), so the turn cannot be left out alone")
    return [s for s, m in zip(spans, replies) if not m.get(NOT_TRAINED)], ""


def assistant_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for every token overlapping an assistant span (as apply_chat_template's assistant_masks)."""
    starts = [s for s, _ in offsets]
    ends = [e for _, e in offsets]
    mask = [0] * len(offsets)
    for a, b in spans:  # tokens ending after a and starting before b; offsets are in order
        first, stop = bisect.bisect_right(ends, a), bisect.bisect_left(starts, b)
        mask[first:stop] = [1] * max(0, stop - first)
    return mask


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of a 0/1 mask."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs


def budget(source: int, target: int, cutoff: int) -> tuple[int, int]:
    """How much of a (prompt, reply) pair fits ``cutoff`` tokens: LLaMA-Factory's ``infer_seqlen``. A short reply
    keeps all of itself and the prompt is cut; a long one keeps its share, so a long prompt never empties it."""
    if target * 2 < cutoff:
        max_target = cutoff
    elif source * 2 < cutoff:
        max_target = cutoff - source
    else:
        max_target = int(cutoff * (target / (source + target)))
    new_target = min(max_target, target)
    new_source = min(max(cutoff - new_target, 0), source)
    return new_source, new_target


def fit(ids: list[int], mask: list[int], cutoff: int, keep_last: bool = False) -> tuple[list[int], list[int]]:
    """``ids`` within ``cutoff`` tokens: unchanged if they fit; else each (prompt, reply) pair in turn gets
    ``budget`` of what is left (the last pair first with ``keep_last``), its prompt cut at the end, its reply
    at the end, and a pair that gets nothing is dropped."""
    if len(ids) <= cutoff:
        return ids, mask
    runs = _runs(mask)
    pairs, i = [], 0
    while i < len(runs):  # (prompt run, reply run); a leading reply or a trailing prompt stands alone
        prompt = runs[i] if runs[i][0] == 0 else None
        reply = runs[i + 1] if prompt and i + 1 < len(runs) else (runs[i] if not prompt else None)
        pairs.append((prompt, reply))
        i += 2 if prompt and reply else 1
    order = list(range(len(pairs)))[::-1] if keep_last else list(range(len(pairs)))
    kept: dict[int, tuple[int, int]] = {}
    left = cutoff
    for p in order:
        prompt, reply = pairs[p]
        n_src = prompt[2] - prompt[1] if prompt else 0
        n_tgt = reply[2] - reply[1] if reply else 0
        if left <= 0:
            break
        src, tgt = budget(n_src, n_tgt, left)
        kept[p] = (src, tgt)
        left -= src + tgt
    out_ids, out_mask = [], []
    for p, (prompt, reply) in enumerate(pairs):
        if p not in kept:
            continue
        src, tgt = kept[p]
        if prompt:
            out_ids += ids[prompt[1]:prompt[1] + src]
            out_mask += [0] * src
        if reply:
            out_ids += ids[reply[1]:reply[1] + tgt]
            out_mask += [1] * tgt
    return out_ids, out_mask
