"""Messages as a chat template takes them: where each template reads an assistant turn's reasoning (a field, gpt-oss's
``thinking``, inline ``<think>``, or nowhere: DeepSeek-R1's keeps only what follows ``</think>``) and how DeepSeek's
templates take calls. Used by the encoder and by the probes of template_facts.py, so both render the same input."""

from __future__ import annotations

import functools
import json
from typing import Any

from scaletrain.data.formats import REASONING


def with_reasoning(messages: list[dict], template: str) -> list[dict]:
    """The messages as ``template`` can write them: a template that reads ``reasoning_content`` (Qwen3's) gets the
    field and decides where reasoning is kept; gpt-oss's gets it as ``thinking``; DeepSeek-R1's (and V3's), which
    keeps only what follows ``</think>`` and no field, gets the reply alone (an inline block would leave the
    ``\n\n`` after it, which the model never writes after ``<｜Assistant｜>``; that the template trains no reasoning
    is said at start) and its calls as that family writes them; any other gets the reasoning inside the reply as
    ``<think>...</think>`` (the convention those models write), so no reasoning in the data is dropped unseen. Call
    arguments given as a JSON string stay as written where the template writes a string as it is (Qwen3's), and
    are parsed for one that writes only a mapping."""
    if DEEPSEEK_CALLS in template:
        messages = [_deepseek(m) if m.get("role") == "assistant" else m for m in messages]
    elif any(_string_arguments(m) for m in messages) and not writes_string_arguments(template):
        messages = [_parsed_arguments(m) if _string_arguments(m) else m for m in messages]
    if THINKING in template:  # gpt-oss's harmony template: the reasoning goes to its analysis channel
        return [_thinking(m) if m.get("role") == "assistant" else m for m in messages]
    if REASONING in template or not any(REASONING in m for m in messages):
        return messages
    if _keeps_after_think(template):
        return [{k: v for k, v in m.items() if k != REASONING} for m in messages]
    return [{**{k: v for k, v in m.items() if k != REASONING},
             "content": f"<think>\n{m[REASONING].strip()}\n</think>\n\n{m.get('content') or ''}"}
            if REASONING in m else m for m in messages]


def reasoning_inline(template: str) -> bool:
    """Whether ``template`` has no reasoning of its own (no reasoning_content or thinking field, not DeepSeek-R1's
    rule): reasoning in the data then trains as a <think> block inside the reply (with_reasoning)."""
    return THINKING not in template and REASONING not in template and not _keeps_after_think(template)


def _keeps_after_think(template: str) -> bool:
    return _KEEPS_AFTER_THINK in template or _KEEPS_AFTER_THINK.replace("'", '"') in template


THINKING = "message.thinking"  # how gpt-oss's template reads an assistant turn's reasoning (its `thinking` field)
DEEPSEEK_CALLS = "<｜tool▁calls▁begin｜>"  # DeepSeek-V3/R1's call format
_KEEPS_AFTER_THINK = "split('</think>')[-1]"  # a template that writes only what follows a think block


def _deepseek(m: dict) -> dict:
    """A DeepSeek-R1/V3 call turn as that family's template reads it: the arguments as a JSON string (it joins them
    into the text as given) and no reply where the data has an empty one (the template writes the calls only when
    the reply is None; an empty reply would add an empty turn whose end-of-sentence token trains)."""
    if not m.get("tool_calls"):
        return m
    calls = [{**c, "function": {**c["function"], "arguments": c["function"]["arguments"] if isinstance(
        c["function"].get("arguments"), str) else json.dumps(c["function"].get("arguments", {}), ensure_ascii=False)}}
             for c in m["tool_calls"]]
    return {**m, "tool_calls": calls, "content": m.get("content") or None}


def _string_arguments(m: dict) -> bool:
    return any(isinstance(c.get("function", {}).get("arguments"), str) for c in m.get("tool_calls") or ())


def _parsed_arguments(m: dict) -> dict:
    """A call turn whose arguments are JSON strings, for a template that writes only a mapping (its ``tojson`` would
    write a string quoted, with its quotes escaped)."""
    return {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(a)}}
                                if isinstance(a := c.get("function", {}).get("arguments"), str) else c
                                for c in m["tool_calls"]]}


@functools.lru_cache(maxsize=16)
def writes_string_arguments(template: str) -> bool:
    """Whether ``template`` writes a call's arguments given as a JSON string as they are (Qwen3's released templates:
    ``arguments is string``), found by rendering one call: the model then writes that string at inference, so
    training keeps it as the data gives it (a compact ``{"city":"paris"}`` stays compact)."""
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import render_jinja_template

    probe = '{"x":"probe"}'  # compact: a mapping through tojson would read {"x": "probe"}
    chat = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": "probe0001", "function": {"name": "probe", "arguments": probe}}]}]
    try:
        (text,), _ = render_jinja_template([chat], chat_template=template)
    except (TemplateError, TypeError, ValueError, KeyError, AttributeError):
        return False
    return probe in text


def _thinking(m: dict) -> dict:
    """An assistant turn with its reasoning in ``thinking``: from ``reasoning_content``, or from ``<think>`` in the
    reply (the reply then without it)."""
    content, reasoning = m.get("content") or "", m.get(REASONING)
    if not (isinstance(reasoning, str) and reasoning.strip()) and "</think>" in content:
        reasoning = content.split("</think>")[0].split("<think>")[-1].strip("\n")
        content = content.split("</think>")[-1].lstrip("\n")
    out = {k: v for k, v in m.items() if k != REASONING}
    out["content"] = content
    if isinstance(reasoning, str) and reasoning.strip():
        out["thinking"] = reasoning
    return out


def template_variables(tokenizer, enable_thinking: bool | None = None) -> dict[str, Any]:
    """What a chat template renders with: the tokenizer's special tokens, and ``enable_thinking`` when it is set."""
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    return {**special_tokens(tokenizer), **extra}


def special_tokens(tokenizer) -> dict[str, Any]:
    return {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
