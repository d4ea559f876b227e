"""Chat templates: the tokenizer's own (``data.template: auto``), a built-in by name, or a ``.jinja`` file.

A template is rendered with transformers' own Jinja machinery (``render_jinja_template``, what
``apply_chat_template`` runs), so the text, and the token ids, are the ones every chat front end that uses the
same template produces. The built-ins mark each assistant turn with ``{% generation %}``: its span (the reply
and the end-of-turn token the template writes, which the model must learn to emit) is read from one render.
A template without those marks (most tokenizers' own) gets its assistant spans from prefix renders: the text
of turns 0..i with the generation prompt, against the text of turns 0..i+1.

Built-ins reproduce the formats in their model cards (single-line Jinja; each ends a turn as the card does):
- ``alpaca``: Stanford Alpaca's prompt (tatsu-lab/stanford_alpaca, README "prompt"), "### Instruction:" /
  "### Input:" / "### Response:", the reply followed by the EOS token; turns separated by a blank line.
- ``chatml``: OpenAI ChatML as the Qwen2/Qwen2.5 tokenizer_config.json ``chat_template`` writes it
  (``<|im_start|>{role}\\n{content}<|im_end|>\\n``), without Qwen's default system prompt.
- ``llama3``: Meta Llama 3 model card, "Prompt format" (``<|begin_of_text|>``,
  ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``).
- ``mistral``: Mistral-7B-Instruct model card, "Instruction format" (``<s>[INST] {user} [/INST]{reply}</s>``;
  a system prompt goes before the first user message, as Mistral's v0.3 template does).
- ``gemma``: Gemma model card, "Chat Template" (``<start_of_turn>user\\n...<end_of_turn>\\n<start_of_turn>model\\n``;
  Gemma has no system role: it goes before the first user message).
- ``vicuna``: FastChat's vicuna_v1.1 conversation template ("... USER: {user} ASSISTANT: {reply}</s>").
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from scaletrain.errors import ConfigError, DataError

_GEN = "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"

BUILTIN_TEMPLATES: dict[str, str] = {
    "alpaca": (
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
        "{% elif message['role'] == 'user' %}"
        "{% if message.get('input') %}{{ '### Instruction:\n' + message['instruction'] + '\n\n### Input:\n'"
        " + message['input'] + '\n\n### Response:\n' }}"
        "{% else %}{{ '### Instruction:\n' + message['content'] + '\n\n### Response:\n' }}{% endif %}"
        "{% elif message['role'] == 'assistant' %}" + _GEN + "{% if not loop.last %}{{ '\n\n' }}{% endif %}"
        "{% endif %}{% endfor %}"
    ),
    "chatml": (
        "{% for message in messages %}"
        "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
        "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
        "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
        "{% if message['role'] == 'assistant' %}"
        "{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
        "{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
    "mistral": (
        "{{ bos_token }}{% set ns = namespace(system='') %}"
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
        "{% elif message['role'] == 'user' %}{{ '[INST] ' + ns.system + message['content'] + ' [/INST]' }}"
        "{% set ns.system = '' %}"
        "{% elif message['role'] == 'assistant' %}" + _GEN + "{% endif %}"
        "{% endfor %}"
    ),
    "gemma": (
        "{{ bos_token }}{% set ns = namespace(system='') %}"
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
        "{% elif message['role'] == 'user' %}"
        "{{ '<start_of_turn>user\n' + ns.system + message['content'] | trim + '<end_of_turn>\n' }}"
        "{% set ns.system = '' %}"
        "{% elif message['role'] == 'assistant' %}{{ '<start_of_turn>model\n' }}"
        "{% generation %}{{ message['content'] | trim + '<end_of_turn>' }}{% endgeneration %}{{ '\n' }}"
        "{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
    ),
    "vicuna": (
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}{{ message['content'] + ' ' }}"
        "{% elif message['role'] == 'user' %}{{ 'USER: ' + message['content'] + ' ASSISTANT:' }}"
        "{% elif message['role'] == 'assistant' %}{{ ' ' }}" + _GEN + "{% endif %}"
        "{% endfor %}"
    ),
}

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


def render(conversations: list[list[dict]], template: str, special_tokens: dict, where: str
           ) -> tuple[list[str], list[list[tuple[int, int]]]]:
    """The rendered text of each conversation and the character spans of its assistant turns."""
    import jinja2
    from transformers.utils.chat_template_utils import render_jinja_template

    if template in FAST_RENDERERS:
        fast = FAST_RENDERERS[template]
        eos = special_tokens.get("eos_token", "")
        rendered = [fast(chat, eos) for chat in conversations]
        return [t for t, _ in rendered], [s for _, s in rendered]
    try:
        if has_generation_marks(template):
            texts, spans = render_jinja_template(conversations, chat_template=template,
                                                 return_assistant_tokens_mask=True, **special_tokens)
            return texts, [list(s) for s in spans]
        texts, _ = render_jinja_template(conversations, chat_template=template, **special_tokens)
        return texts, [_prefix_spans(chat, text, template, special_tokens) for chat, text in zip(conversations, texts)]
    except jinja2.TemplateError as e:
        line = f", line {e.lineno}" if getattr(e, "lineno", None) else ""
        raise DataError(f"data.template: {where}{line} fails to render: {e}; fix the template") from None


def _prefix_spans(chat: list[dict], text: str, template: str, special_tokens: dict) -> list[tuple[int, int]]:
    """Assistant spans of a template without generation marks: what turn i adds after the generation prompt."""
    from transformers.utils.chat_template_utils import render_jinja_template

    spans = []
    for i, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        (before,), _ = render_jinja_template([chat[:i]], chat_template=template, add_generation_prompt=True,
                                            **special_tokens)
        (through,), _ = render_jinja_template([chat[:i + 1]], chat_template=template, **special_tokens)
        if not (text.startswith(through) and through.startswith(before)):
            raise DataError("data.template: the chat template renders a conversation's turns differently alone and "
                            "in the whole conversation, so its assistant turns cannot be isolated for the loss; "
                            "use a built-in template (data.template=chatml, llama3, ...)")
        spans.append((len(before), len(through)))
    return spans
