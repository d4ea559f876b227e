"""Messages whose content is a list of typed parts, as LLaMA-Factory v1's data files and the OpenAI / transformers
form write them, read into the messages the chat templates take:

- ``{"type": "text", "value": ...}`` (v1) or ``{"type": "text", "text": ...}`` (OpenAI): the content, parts joined
  as the templates that take parts join them (nothing between: Qwen2-VL's and Gemma 3's ``{{ content['text'] }}``);
- ``{"type": "reasoning", "value": ...}``: the turn's reasoning (``reasoning_content``, the same rules as the field);
- ``{"type": "tool_call", "value": '{"name": ..., "arguments": ...}'}``: one of the turn's tool calls;
- image parts (``image_url`` / ``image``: a path or URL, v1's ``value`` or OpenAI's ``{"url"}``): read as
  LLaMA-Factory's rows are (``images_from_parts``: a ``<image>`` where the part was, its path in the record's
  images), so a vision-language model sees each image where it was written and a text model refuses the file in one
  line; video and audio parts are the record's skip reason.

A part of an unknown type, or without its value, is the record's skip reason, naming the turn and the type.
``loss_weight`` (v1): 0 leaves an assistant turn out of the loss, 1 trains it; another weight is a skip reason
until weighted losses are read.
"""

from __future__ import annotations

import json

TEXT, REASONING_PART, TOOL_CALL = "text", "reasoning", "tool_call"
MEDIA = ("video_url", "video", "audio_url", "audio", "input_audio")  # image parts: images_from_parts
KNOWN = (TEXT, REASONING_PART, TOOL_CALL, "image_url", "image", *MEDIA)


def is_parts(content) -> bool:
    """A list of typed parts (not a tool's JSON result, which is a list of anything else)."""
    return isinstance(content, list) and bool(content) and all(isinstance(p, dict) and "type" in p for p in content)


def _value(part: dict):
    for key in ("value", part.get("type"), "text"):
        if key in part and part[key] is not None:
            return part[key]
    return None


def from_parts(turn: dict, content_tag: str, i: int, tag) -> tuple[dict | None, str]:
    """The turn with its parts read: text content, ``reasoning_content``, ``tool_calls``; or why it cannot be."""
    texts, reasoning, calls = [], [], []
    for k, part in enumerate(turn[content_tag]):
        kind = part["type"]
        if kind not in KNOWN:
            return None, (f"turn {i} ({tag}): part {k} has unknown type {kind!r} (known: "
                          f"{', '.join(KNOWN)})")
        if kind in MEDIA:
            return None, (f"turn {i} ({tag}): part {k} is {kind!r}: videos and audio are not supported (images are, "
                          f"with a vision-language model)")
        if kind in ("image_url", "image"):  # (images_from_parts reads them before: here only when it did not run)
            return None, f"turn {i} ({tag}): part {k} is {kind!r}, in a record read without its images"
        value = _value(part)
        if value is None:
            return None, f"turn {i} ({tag}): part {k} ({kind!r}) has no value"
        if kind == TOOL_CALL:
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    return None, f"turn {i} ({tag}): part {k} (tool_call) is not JSON {{\"name\", \"arguments\"}}"
            calls.append(value)
        elif not isinstance(value, str):
            return None, f"turn {i} ({tag}): part {k} ({kind!r}) is not text"
        else:
            (texts if kind == TEXT else reasoning).append(value)
    out = {key: v for key, v in turn.items() if key != content_tag}
    out[content_tag] = "".join(texts)
    if reasoning:
        if any(turn.get(f) for f in ("reasoning_content", "thinking", "reasoning")):
            return None, f"turn {i} ({tag}): reasoning both in a part and in a field; keep one"
        out["reasoning_content"] = "".join(reasoning)
    if calls:
        if turn.get("tool_calls"):
            return None, f"turn {i} ({tag}): tool calls both in parts and in 'tool_calls'; keep one"
        out["tool_calls"] = calls
    return out, ""


IMAGES = ("image_url", "image")
PLACEHOLDER = "<image>"  # LLaMA-Factory's image placeholder (data/vision.py reads it)


def has_image_parts(rows, messages: str, content: str) -> bool:
    """Whether any of ``rows`` has an image part in a message's content."""
    return any(isinstance(m, dict) and is_parts(m.get(content)) and any(p["type"] in IMAGES for p in m[content])
               for r in rows for m in (r.get(messages) or []))


def images_from_parts(row: dict, messages: str, content: str, images: str) -> dict:
    """A record's image parts as LLaMA-Factory's rows hold images: a text part ``<image>`` where each was, its path
    in ``images`` in order; every part written {type, value} (one Arrow schema for every row)."""
    paths, out = list(row.get(images) or []), []
    for m in row.get(messages) or []:
        parts = m.get(content)
        if not is_parts(parts):
            out.append(m)
            continue
        new = []
        for p in parts:
            value = _value(p)
            if p["type"] in IMAGES:
                paths.append(value.get("url") if isinstance(value, dict) else value)
                new.append({"type": TEXT, "value": PLACEHOLDER})
            else:
                new.append({"type": p["type"], "value": value if isinstance(value, str) or value is None
                            else json.dumps(value)})
        out.append({**m, content: new})
    return {messages: out, images: paths}


def loss_weight(turn: dict, i: int, tag) -> tuple[float | None, str]:
    """A turn's ``loss_weight`` (None: not given), or why it cannot be read."""
    w = turn.get("loss_weight")
    if w is None:
        return None, ""
    if isinstance(w, bool) or not isinstance(w, (int, float)):
        return None, f"turn {i} ({tag}): loss_weight {w!r} is not a number"
    if w not in (0, 1):
        return None, (f"turn {i} ({tag}): loss_weight {w:g}: 0 (not trained) and 1 (trained) are read; a weighted "
                      f"loss is not yet")
    return float(w), ""
