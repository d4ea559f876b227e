"""Where a chat template writes each assistant turn, as character spans of the rendered conversation (the labels):
what turn i adds after the generation prompt where the renders of a conversation's prefixes are prefixes of the
whole, else each turn located in the one render of the whole conversation by a probe render (templates that write
the history differently from the last turn: Qwen3's, DeepSeek-R1's, QwQ's). templates.py renders; this finds."""

from __future__ import annotations

import functools

from scaletrain.errors import DataError


def assistant_spans(chat: list[dict], text: str, template: str, special_tokens: dict, tools: list[dict] | None = None
                  ) -> list[tuple[int, int]]:
    """Assistant spans of a template without generation marks: what turn i adds after the generation prompt, where
    the renders of the conversation's prefixes are prefixes of the whole; else (Qwen3, DeepSeek-R1, QwQ: the
    history is written differently from the last turn) the turns located in the one render of the whole."""
    from transformers.utils.chat_template_utils import render_jinja_template

    spans = []
    for i, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        (before,), _ = render_jinja_template([chat[:i]], tools=tools, chat_template=template,
                                            add_generation_prompt=True, **special_tokens)
        (through,), _ = render_jinja_template([chat[:i + 1]], tools=tools, chat_template=template, **special_tokens)
        if not (text.startswith(through) and through.startswith(before)):
            return located_spans(chat, text, template, special_tokens, tools)
        spans.append((len(before), len(through)))
    return spans


# Replaces an assistant turn's reply to find where the template writes it: characters no reply starts or ends with
# in practice, so the difference between the two renders begins and ends exactly at the reply.
_PROBE = "\u2402\u2403"


def turn_marks(template: str, special_tokens: dict) -> tuple[tuple[str, ...], str, str]:
    """What the template writes around an assistant reply: the heads a reply follows, longest first (the generation
    prompt after a user turn, ``<|im_start|>assistant\\n<think>\\n``, and its line-ending prefixes, ``<|im_start|>
    assistant\\n``: a reply is what the model writes after it), the end of the last turn (``<|im_end|>``,
    ``<|eot_id|>``, ``<end_of_turn>``: the text after a probe reply up to its first line break, else EOS) and the
    end of a turn in the history where the template writes another one (gpt-oss's harmony format ends the last
    turn with ``<|return|>`` and earlier ones with ``<|end|>``; else the same)."""
    return _turn_marks(template, tuple(sorted(special_tokens.items())))


@functools.lru_cache(maxsize=16)  # four probe renders per template, not per conversation
def _turn_marks(template: str, special: tuple) -> tuple[tuple[str, ...], str, str]:
    from transformers.utils.chat_template_utils import render_jinja_template

    special_tokens = dict(special)
    user = [{"role": "user", "content": "hello"}]
    (prompted,), _ = render_jinja_template([user], chat_template=template, add_generation_prompt=True,
                                           **special_tokens)
    (asked,), _ = render_jinja_template([user], chat_template=template, **special_tokens)
    head = prompted[len(asked):] if prompted.startswith(asked) else ""
    cuts = {head[:i + 1] for i, c in enumerate(head) if c == "\n"} | ({head} if head else set())
    if "<think>" in head:  # a call turn is written after the head without the think block it opens (R1's)
        cuts.add(head[:head.index("<think>")])
    heads = tuple(sorted({c for c in cuts if c}, key=len, reverse=True))
    (text,), _ = render_jinja_template([[*user, {"role": "assistant", "content": _PROBE}]], chat_template=template,
                                       **special_tokens)
    after = text[text.rindex(_PROBE) + len(_PROBE):] if _PROBE in text else ""
    end = after.strip().split("\n")[0] or special_tokens.get("eos_token", "")
    # The same reply followed by a generation prompt is a turn of the history: what it ends with before the prompt.
    (more,), _ = render_jinja_template([[*user, {"role": "assistant", "content": _PROBE}]], chat_template=template,
                                       add_generation_prompt=True, **special_tokens)
    after = more[more.rindex(_PROBE) + len(_PROBE):] if _PROBE in more else ""
    after = after[:-len(head)] if head and after.endswith(head) else ""
    return heads, end, after.strip().split("\n")[0] or end


@functools.lru_cache(maxsize=16)
def call_end(template: str, special: tuple) -> str:
    """What the template writes after a call's arguments to end the call turn (gpt-oss's ``<|call|>``, Qwen's
    ``</tool_call><|im_end|>``); "" where it writes no calls."""
    from transformers.utils.chat_template_utils import render_jinja_template

    tool = {"type": "function", "function": {"name": "probe", "description": "probe", "parameters": {
        "type": "object", "properties": {"x": {"type": "string"}}}}}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": "probe0001", "function": {"name": "probe", "arguments": {"x": _PROBE}}}]}
    try:
        (text,), _ = render_jinja_template([[{"role": "user", "content": "hello"}, call]], tools=[tool],
                                           chat_template=template, **dict(special))
    except Exception:  # noqa: BLE001 - a template without a tool format raises in its own way
        return ""
    if _PROBE not in text:
        return ""
    after = text[text.rindex(_PROBE) + len(_PROBE):].lstrip('"}] \n')
    return after.split("\n")[0]


def _reply_start(text: str, start: int, heads: tuple[str, ...], end: str) -> int:
    """Where the model's reply begins, for a turn whose own characters begin at ``start``: right after the longest
    head of the template that closes before ``start`` in this turn (no end of turn between), else ``start``."""
    for head in heads:
        at = text.rfind(head, 0, start)
        if at >= 0 and at + len(head) <= start and not (end and end in text[at + len(head):start]):
            return at + len(head)
    return start


def located_spans(chat: list[dict], text: str, template: str, special_tokens: dict, tools: list[dict] | None = None
                  ) -> list[tuple[int, int]]:
    """Each assistant turn's span in ``text``, the one render of the whole conversation: the conversation is
    rendered again with that turn's reply (and reasoning) replaced by a probe, and the characters where the two
    renders differ are the turn's own (reasoning the template keeps included); the span begins where the model's
    reply begins (after the template's head for it: ``<think>\\n\\n</think>\\n\\n`` that closes an empty reasoning
    is the model's to write) and runs on through the end-of-turn text (tool calls written after the reply
    included). A turn the template does not
    write (Qwen3 drops the reasoning of turns before the last query; a whole turn dropped) has no span there.
    A difference that crosses into another turn cannot be isolated: an error."""
    from transformers.utils.chat_template_utils import render_jinja_template

    heads, end, end_before = turn_marks(template, special_tokens)
    spans = []
    for i, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        probe = _probed(message)
        (other,), _ = render_jinja_template([[*chat[:i], probe, *chat[i + 1:]]], tools=tools, chat_template=template,
                                           **special_tokens)
        start = 0
        while start < min(len(text), len(other)) and text[start] == other[start]:
            start += 1
        tail = 0
        while tail < min(len(text), len(other)) - start and text[-1 - tail] == other[-1 - tail]:
            tail += 1
        stop = len(text) - tail
        if start == len(text) == len(other):
            if message.get("tool_calls"):  # its calls are written, and would not be trained: never silently
                raise DataError("data.template: the chat template writes an assistant turn's tool calls without its "
                                "reply, so the turn cannot be located for the loss; use data.multi_turn=per_turn (each "
                                "turn trained as the conversation's last)")
            continue  # the template does not write this turn's reply
        if end and end in text[start:stop]:
            raise DataError("data.template: the chat template writes an assistant turn's reply into other turns too, "
                            "so the turn cannot be isolated for the loss; use data.mask_history=true (the last "
                            "turn only) or a built-in template")
        marks = (end, end_before, call_end(template, tuple(sorted(special_tokens.items())))
                 if message.get("tool_calls") else "")
        ends = [(text.find(e, stop), e) for e in dict.fromkeys(marks) if e]
        close, mark = min(((at, e) for at, e in ends if at >= 0), default=(-1, ""))
        span = (_reply_start(text, start, heads, end), close + len(mark) if close >= 0 else stop)
        if i + 1 < len(chat) and span[1] > _written_at(chat, i + 1, text, template, special_tokens, tools):
            raise DataError("data.template: the chat template ends an assistant turn in a way its last turn does not "
                            "show, so the turn's end cannot be found (it would train the next turn's text); use "
                            "data.multi_turn=per_turn (each turn trained as the conversation's last) or a built-in "
                            "template")
        spans.append(span)
    return spans


def _probed(message: dict) -> dict:
    """The assistant turn with everything the model writes in it changed: its reply (a None reply, which a template
    such as DeepSeek-R1's reads as "calls only", stays None), no reasoning, and each call's arguments (a call turn
    whose reply the template does not write is still found by its calls; its name is kept, since a template may
    repeat it in the result that follows)."""
    probe = {**message, "content": _PROBE if message.get("content") is not None else None}
    probe.pop("reasoning_content", None)
    probe.pop("thinking", None)
    if message.get("tool_calls"):
        probe["tool_calls"] = [_probed_call(c) for c in message["tool_calls"]]
    return probe


def _probed_call(call: dict) -> dict:
    f = call.get("function", call)
    args = _PROBE if isinstance(f.get("arguments"), str) else {_PROBE: _PROBE}
    f = {**f, "arguments": args}
    return {**call, "function": f} if "function" in call else f


def _written_at(chat: list[dict], j: int, text: str, template: str, special_tokens: dict, tools) -> int:
    """Where message ``j`` begins to differ when its content is a probe: no span of an earlier turn may reach it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    if not isinstance(chat[j].get("content"), str) or not chat[j]["content"]:
        return len(text)
    (other,), _ = render_jinja_template([[*chat[:j], {**chat[j], "content": _PROBE}, *chat[j + 1:]]], tools=tools,
                                       chat_template=template, **special_tokens)
    at = 0
    while at < min(len(text), len(other)) and text[at] == other[at]:
        at += 1
    return at
