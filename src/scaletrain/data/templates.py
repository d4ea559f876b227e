"""Chat templates: the tokenizer's own (``data.template: auto``), a built-in by name, or a ``.jinja`` file.

A template is rendered with transformers' own Jinja machinery (``render_jinja_template``, what
``apply_chat_template`` runs), so the text, and the token ids, are the ones every chat front end that uses the
same template produces. The built-ins mark each assistant turn with ``{% generation %}``: its span (the reply
and the end-of-turn token the template writes, which the model must learn to emit) is read from one render.
A template without those marks (most tokenizers' own) gets its assistant spans from prefix renders: the text
of turns 0..i with the generation prompt, against the text of turns 0..i+1.

The built-ins' sources are in builtin_templates.py. A record a template cannot render (its ``raise_exception``, a
missing field) is skipped and counted with the template's own words; tools under a template without a tool format
are an error, never dropped.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from jinja2 import TemplateError

from scaletrain.data.builtin_templates import BUILTIN_TEMPLATES, TOOL_TEMPLATES
from scaletrain.data.spans import assistant_spans
from scaletrain.errors import ConfigError, DataError

_TOOLS_WORD = re.compile(r"\btool")


def supports_tools(template: str) -> bool:
    """Whether a template renders tools: a built-in of TOOL_TEMPLATES, or a model's own that mentions them."""
    builtin = next((name for name, source in BUILTIN_TEMPLATES.items() if source == template), None)
    return builtin in TOOL_TEMPLATES if builtin else bool(_TOOLS_WORD.search(template))


_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_marks(template: str) -> bool:
    return bool(_GENERATION_TAG.search(template))


def resolve_template(setting: str, tokenizer) -> tuple[str, str]:
    """(name, Jinja source) for ``data.template``: ``auto``, a built-in name, or a path to a ``.jinja`` file."""
    if setting == "auto":
        own = getattr(tokenizer, "chat_template", None)
        if isinstance(own, str) and own:
            return "tokenizer", own
        return "alpaca", BUILTIN_TEMPLATES["alpaca"]
    if setting in BUILTIN_TEMPLATES:
        return setting, BUILTIN_TEMPLATES[setting]
    if setting.endswith(".jinja") or "/" in setting:
        path = Path(setting).expanduser()
        if not path.is_file():
            raise ConfigError(f"data.template={setting}: no such file; give a .jinja file or one of "
                              f"{', '.join(BUILTIN_TEMPLATES)}")
        source = path.read_text()
        check_syntax(source, str(path))
        return str(path), source
    near = difflib.get_close_matches(setting, list(BUILTIN_TEMPLATES), n=3, cutoff=0.4)
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    raise ConfigError(f"data.template={setting} is not a template: {hint}use auto (the tokenizer's own), one of "
                      f"{', '.join(BUILTIN_TEMPLATES)}, or the path of a .jinja file")


def check_syntax(source: str, where: str) -> None:
    import jinja2
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(source)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"data.template: {where}, line {e.lineno}: {e.message}; fix the template") from None


def _render_alpaca(chat: list[dict], eos: str) -> tuple[str, list[tuple[int, int]]]:
    parts, spans, n = [], [], 0
    for i, m in enumerate(chat):
        if m["role"] == "system":
            piece = m["content"] + "\n\n"
        elif m["role"] == "user":
            piece = (f"### Instruction:\n{m['instruction']}\n\n### Input:\n{m['input']}\n\n### Response:\n"
                     if m.get("input") else f"### Instruction:\n{m['content']}\n\n### Response:\n")
        elif m["role"] == "assistant":
            reply = m["content"] + eos
            spans.append((n, n + len(reply)))
            piece = reply + ("\n\n" if i < len(chat) - 1 else "")
        else:
            piece = ""
        parts.append(piece)
        n += len(piece)
    return "".join(parts), spans


def _render_chatml(chat: list[dict], eos: str) -> tuple[str, list[tuple[int, int]]]:
    parts, spans, n = [], [], 0
    for m in chat:
        if m["role"] == "assistant":
            head = "<|im_start|>assistant\n"
            reply = m["content"] + "<|im_end|>"
            spans.append((n + len(head), n + len(head) + len(reply)))
            piece = head + reply + "\n"
        else:
            piece = f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
        parts.append(piece)
        n += len(piece)
    return "".join(parts), spans


# Plain-Python renderers of the most used built-ins, the same text and spans as their Jinja source (tested
# against it on every run of the suite): Jinja costs ~50 us a conversation on this machine, as much as
# tokenizing it, and data preparation of millions of conversations is paid on every new dataset.
FAST_RENDERERS = {BUILTIN_TEMPLATES["alpaca"]: _render_alpaca, BUILTIN_TEMPLATES["chatml"]: _render_chatml}


Rendered = tuple[str, list[tuple[int, int]]]  # a conversation's text and its assistant spans
# What a template raises on a record it cannot render (raise_exception is a TemplateError; a missing key or a
# value of the wrong type, a TypeError or ValueError from a filter).
_RENDER_ERRORS = (TemplateError, TypeError, ValueError, KeyError)


def render(conversations: list[list[dict]], template: str, special_tokens: dict, where: str,
           tools: list[list[dict] | None] | None = None) -> tuple[list[str], list[list[tuple[int, int]]]]:
    """The rendered text of each conversation and the character spans of its assistant turns; a conversation the
    template cannot render is an error."""
    out = render_records(conversations, template, special_tokens, tools)
    for i, r in enumerate(out):
        if isinstance(r, str):
            raise DataError(f"data.template: {where}: conversation {i + 1}: {r}; fix the template")
    return [t for t, _ in out], [s for _, s in out]


def render_records(conversations: list[list[dict]], template: str, special_tokens: dict,
                   tools: list[list[dict] | None] | None = None) -> list[Rendered | str]:
    """Each conversation rendered (with its own tool declarations, if any), or why the template cannot render it
    in the template's own words. Conversations without tools go through Jinja in one batch; one that fails sends
    the batch through one by one, to name it."""
    tools = tools or [None] * len(conversations)
    plain = [i for i, t in enumerate(tools) if not t]
    results: list[Rendered | str] = [""] * len(conversations)
    if template in FAST_RENDERERS:
        fast, eos = FAST_RENDERERS[template], special_tokens.get("eos_token", "")
        batch = [fast(conversations[i], eos) for i in plain]
    else:
        try:
            batch = _render_batch([conversations[i] for i in plain], template, special_tokens, None)
        except _RENDER_ERRORS:
            batch = [_render_one(conversations[i], template, special_tokens, None) for i in plain]
    for i, r in zip(plain, batch):
        results[i] = r
    for i, t in enumerate(tools):
        if t:
            results[i] = _render_one(conversations[i], template, special_tokens, t)
    heads: tuple[str, ...] = ()
    if template not in FAST_RENDERERS:
        from scaletrain.data.spans import turn_marks

        heads = turn_marks(template, special_tokens)[0]
    empty = EMPTY_THINK if writes_no_think_blocks(template, special_tokens) else None
    return [r if isinstance(r, str) else (r[0], as_the_model_writes(r[0], r[1], heads, empty)) for r in results]


EMPTY_THINK = "<think>\n\n</think>\n\n"


def as_the_model_writes(text: str, spans: list[tuple[int, int]], heads: tuple[str, ...] = (),
                        empty: str | None = None) -> list[tuple[int, int]]:
    """The labels are what the model writes after its generation prompt, the same for every template and mode: a turn
    begins after the generation prompt (``heads``: a template's generation marks may open the span inside it, as
    Qwen3-Thinking's ``<think>\n``, which the prompt writes), it ends with its end-of-turn token (the line break a
    template writes after it is the template's, not the model's: ChatML's ``<|im_end|>\n``, Gemma's
    ``<end_of_turn>\n``), and, for a model that never writes a think block (``empty``: Qwen3-Instruct-2507, whose
    template still writes an empty one into the last turn), a turn begins after that empty block."""
    out = []
    for a, b in spans:
        for head in heads:  # longest first: a head that begins before the span and ends inside it
            at = text.rfind(head, max(0, a - len(head) + 1), a + len(head))
            if 0 <= at < a < at + len(head) <= b:
                a = at + len(head)
                break
        while b > a and text[b - 1] in " \n":
            b -= 1
        if empty and text.startswith(empty, a):
            a += len(empty)
        out.append((a, b))
    return out


def writes_no_think_blocks(template: str, special_tokens: dict) -> bool:
    """A template that writes think blocks for a model that never writes one: Qwen3-Instruct-2507's (and the
    ``qwen3_nothink`` built-in): ``<think>`` in the template, no thinking switch, and a generation prompt that opens
    none."""
    if "<think>" not in template or "enable_thinking" in template or template in FAST_RENDERERS:
        return False
    from scaletrain.data.spans import turn_marks

    heads, _, _ = turn_marks(template, special_tokens)
    return not any("<think>" in h for h in heads)


def _render_one(chat: list[dict], template: str, special_tokens: dict, tools: list[dict] | None) -> Rendered | str:
    try:
        return _render_batch([chat], template, special_tokens, tools)[0]
    except _RENDER_ERRORS as e:
        return f"the chat template cannot render it: {e}"


def _render_batch(conversations: list[list[dict]], template: str, special_tokens: dict,
                  tools: list[dict] | None) -> list[Rendered]:
    from transformers.utils.chat_template_utils import render_jinja_template

    if not conversations:
        return []
    if has_generation_marks(template):
        texts, spans = render_jinja_template(conversations, tools=tools, chat_template=template,
                                             return_assistant_tokens_mask=True, **special_tokens)
        return [(t, list(s)) for t, s in zip(texts, spans)]
    texts, _ = render_jinja_template(conversations, tools=tools, chat_template=template, **special_tokens)
    return [(text, assistant_spans(chat, text, template, special_tokens, tools))
            for chat, text in zip(conversations, texts)]


# A template's turn markers -> the built-in of that family (its own format, with generation marks).
FAMILY_MARKERS = (("<start_of_turn>", "gemma"), ("<|start_header_id|>", "llama3.1"), ("<|im_start|>", "qwen"),
                  ("[INST]", "mistral"), ("<|channel|>", "gpt_oss"))


def builtin_for(source: str) -> str | None:
    """The built-in that writes the same turn format as ``source`` (a tokenizer's own template), if one does."""
    if "<|im_start|>" in source and "<think>" in source:  # ChatML with Qwen3's thinking blocks
        # Thinking-2507's generation prompt opens <think>, the hybrid's has the enable_thinking switch;
        # Instruct-2507's does neither
        thinks = "assistant\\n<think>\\n' }}" in source or "enable_thinking" in source
        return "qwen3" if thinks else "qwen3_nothink"
    return next((name for marker, name in FAMILY_MARKERS if marker in source), None)


def render_advice(reason: str, template_name: str, source: str = "") -> str:
    """The fix for records a template cannot render, naming the built-in of the tokenizer's own format where there
    is one: a model template that refuses system prompts (gemma's) has a built-in that folds them into the first
    user turn."""
    if "system" in reason.lower() and builtin_for(source) in (None, "gemma"):
        return ("the model's template refuses system prompts: use data.template=gemma (folds the system prompt into "
                "the first user turn, as LLaMA-Factory does) or drop the system column")
    family = builtin_for(source)
    if family and family != template_name:
        return (f"fix those records, or use data.template={family} (the built-in of this template's own turn format, "
                f"now {template_name})")
    return f"fix those records, or choose another data.template (now {template_name})"
