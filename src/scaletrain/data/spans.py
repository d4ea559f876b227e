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


def turn_marks(template: str, special_tokens: dict) -> tuple[tuple[str, ...], str]:
    """What the template writes around an assistant reply: the heads a reply follows, longest first (the generation
    prompt after a user turn, ``<|im_start|>assistant\\n<think>\\n``, and its line-ending prefixes, ``<|im_start|>
    assistant\\n``: a reply is what the model writes after it), and the end of a turn (``<|im_end|>``,
    ``<|eot_id|>``, ``<end_of_turn>``: the text after a probe reply up to its first line break, else EOS)."""
    return _turn_marks(template, tuple(sorted(special_tokens.items())))


@functools.lru_cache(maxsize=16)  # three probe renders per template, not per conversation
def _turn_marks(template: str, special: tuple) -> tuple[tuple[str, ...], str]:
    from transformers.utils.chat_template_utils import render_jinja_template

    special_tokens = dict(special)
    user = [{"role": "user", "content": "hello"}]
    (prompted,), _ = render_jinja_template([user], chat_template=template, add_generation_prompt=True,
                                           **special_tokens)
    (asked,), _ = render_jinja_template([user], chat_template=template, **special_tokens)
    head = prompted[len(asked):] if prompted.startswith(asked) else ""
    heads = tuple(sorted({head[:i + 1] for i, c in enumerate(head) if c == "\n"} | ({head} if head else set()),
                         key=len, reverse=True))
    (text,), _ = render_jinja_template([[*user, {"role": "assistant", "content": _PROBE}]], chat_template=template,
                                       **special_tokens)
    after = text[text.rindex(_PROBE) + len(_PROBE):] if _PROBE in text else ""
    return heads, after.strip().split("\n")[0] or special_tokens.get("eos_token", "")


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

    heads, end = turn_marks(template, special_tokens)
    spans = []
    for i, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        probe = {**message, "content": _PROBE}
        probe.pop("reasoning_content", None)
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
            continue  # the template does not write this turn's reply
        if end and end in text[start:stop]:
            raise DataError("data.template: the chat template writes an assistant turn's reply into other turns too, "
                            "so the turn cannot be isolated for the loss; use data.mask_history=true (the last "
                            "turn only) or a built-in template")
        close = text.find(end, stop) if end else -1
        spans.append((_reply_start(text, start, heads, end), close + len(end) if close >= 0 else stop))
    return spans
