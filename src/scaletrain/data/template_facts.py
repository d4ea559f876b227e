"""What a chat template does to what the model writes, found once per template by rendering small probe
conversations (no guess from the template's text): whether it writes an assistant turn of the history as the model
writes it at inference, whether it writes reasoning at all, whether it keeps every call of a message, and whether the
tokenizer has the turn markers of a built-in. prepare.py says each at start in one
line, or refuses, instead of training on something the user did not mean (#60)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from scaletrain.data.template_input import reasoning_inline, with_reasoning
from scaletrain.data.templates import render_records

_REASONING = "Greet back first."
_TOOL = {"type": "function", "function": {"name": "probe", "description": "probe", "parameters": {
    "type": "object", "properties": {"x": {"type": "string"}}}}}


@dataclass(frozen=True)
class Facts:
    history: tuple[str, str] | None  # (an earlier turn as the template writes it, as the model writes it), or None
    history_reasoned: tuple[str, str] | None  # the same for a turn with reasoning
    writes_reasoning: bool  # the reasoning of a conversation's last turn appears in its render
    one_call_per_message: bool  # the template writes only the first call of a message (gpt-oss's)
    # (the generation prompt's end, the last turn as written after the same header) where the render of a training
    # conversation does not begin with the generation prompt (DeepSeek-R1's: the prompt opens <think>, a written turn
    # never does), or None
    unprompted: tuple[str, str] | None = None


def facts(template: str, special_tokens: dict) -> Facts:
    return _facts(template, tuple(sorted(special_tokens.items())))


@functools.lru_cache(maxsize=16)
def _facts(template: str, special: tuple) -> Facts:
    special_tokens = dict(special)

    def turns(chat: list[dict], tools=None) -> tuple[str, list[str]] | None:
        (r,) = render_records([with_reasoning(chat, template)], template, special_tokens, [tools])
        return None if isinstance(r, str) else (r[0], [r[0][a:b] for a, b in r[1]])

    def history(reasoning: dict) -> tuple[str, str] | None:
        first = {"role": "assistant", "content": "Hi there.", **reasoning}
        chat = [{"role": "user", "content": "Hello."}, first]
        more = [{"role": "user", "content": "Again."}, {"role": "assistant", "content": "Bye."}]
        whole, alone = turns([*chat, *more]), turns(chat)
        if not whole or not alone or not whole[1] or not alone[1] or whole[1][0] == alone[1][-1]:
            return None
        return whole[1][0], alone[1][-1]

    reasoned = turns([{"role": "user", "content": "Hello."},
                      {"role": "assistant", "content": "Hi there.", "reasoning_content": _REASONING}])
    call = {"type": "function", "id": "probe0001", "function": {"name": "probe", "arguments": {"x": "first probe"}}}
    second = {**call, "id": "probe0002", "function": {"name": "probe", "arguments": {"x": "second probe"}}}
    calls = turns([{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "", "tool_calls": [
        call, second]}, {"role": "tool", "content": "1", "tool_call_id": "probe0001"},
        {"role": "tool", "content": "2", "tool_call_id": "probe0002"}, {"role": "assistant", "content": "Done."}],
        [_TOOL])
    return Facts(history({}), history({"reasoning_content": _REASONING}),
                 bool(reasoned) and _REASONING in reasoned[0],
                 bool(calls) and "first probe" in calls[0] and "second probe" not in calls[0],
                 _unprompted(template, special_tokens))


def _unprompted(template: str, special_tokens: dict) -> tuple[str, str] | None:
    from transformers.utils.chat_template_utils import render_jinja_template

    user = [{"role": "user", "content": "Hello."}]
    try:
        (prompt,), _ = render_jinja_template([user], chat_template=template, add_generation_prompt=True,
                                             **special_tokens)
        (whole,), _ = render_jinja_template([[*user, {"role": "assistant", "content": "Hi there."}]],
                                            chat_template=template, **special_tokens)
    except Exception:  # noqa: BLE001 - a template that cannot render the probe says nothing here
        return None
    if whole.startswith(prompt):
        return None
    common = 0
    while common < min(len(prompt), len(whole)) and prompt[common] == whole[common]:
        common += 1
    return prompt[common:], whole[common:]


def check_template(name: str, source: str, tokenizer) -> list[str]:
    """Before any record is read: a built-in whose turn markers the tokenizer has no token for is said (they train as
    plain text pieces). The labels of a built-in begin after its own generation prompt, which final/ keeps for
    inference with the template, so a built-in of another generation prompt than the tokenizer's is no mismatch."""
    from scaletrain.data.builtin_templates import BUILTIN_TEMPLATES

    if name not in BUILTIN_TEMPLATES:
        return []
    missing = [m for m in dict.fromkeys(MARKER.findall(source)) if m not in tokenizer.get_vocab()]
    if not missing:
        return []
    pieces = "; ".join(f"{m} -> {len(tokenizer.tokenize(m))} pieces" for m in missing[:4])
    return [f"data.template={name}: the tokenizer has no token for {len(missing)} of its markers ({pieces}): they "
            f"train as plain text, not as the turn markers a model of that family knows; use data.template=auto (the "
            f"model's own) or a tokenizer of {name}'s family"]


# A built-in's turn markers: special tokens of the families the built-ins write (<|im_start|>, <|eot_id|>,
# <start_of_turn>, <｜Assistant｜>, [INST] ...).
MARKER = re.compile(r"<\|[a-z_]+\|>|<start_of_turn>|<end_of_turn>|<｜[^｜]+｜>|\[/?INST\]")


def conversation_notes(key: str, out, unit_of, template: tuple[str, str], special_tokens: dict, d) -> list[str]:
    """What the data's conversations meet in the template, said at start (or refused): reasoning where
    data.enable_thinking=false says not to think, reasoning the template writes nowhere, and (multi_turn=spans)
    assistant turns before the last that the template writes in a form the model never writes. ``out`` holds the
    per-record counts (encode.STATS); ``unit_of(i)`` names record i's line or row."""
    from scaletrain.errors import DataError

    turns, reasoned = out["_turns"], out["_reasoned"]
    with_reasoning = [i for i, n in enumerate(reasoned) if n]
    said = []
    if d.enable_thinking is False and with_reasoning:
        raise DataError(f"data.enable_thinking=false, and {len(with_reasoning)} records carry reasoning (the first: "
                        f"{unit_of(with_reasoning[0])}): the model would learn to think where the switch says not to; "
                        f"remove data.enable_thinking or the reasoning")
    f = facts(template[1], special_tokens)
    if with_reasoning and d.reasoning == "drop":
        said.append(f"data: {key}: {sum(reasoned)} assistant turns carry reasoning: left out of every turn "
                    f"(data.reasoning: drop)")
    elif with_reasoning and reasoning_inline(template[1]):
        said.append(f"data: {key}: {sum(reasoned)} assistant turns carry reasoning, and the chat template "
                    f"({template[0]}) has no reasoning of its own: it trains as <think>...</think> before each reply, "
                    f"as the data gives it, a block the model's own template never writes; data.reasoning: drop "
                    f"leaves it out")
    elif with_reasoning and not f.writes_reasoning:
        said.append(f"data: {key}: {sum(reasoned)} assistant turns carry reasoning, and the chat template "
                    f"({template[0]}) writes none (it keeps only the reply): their reasoning is not trained; "
                    f"data.template=deepseek_r1 trains the last turn's (DeepSeek-R1 and its distills)")
    if f.unprompted:
        said.append(f"data: {key}: the chat template ({template[0]}) writes an assistant turn as {f.unprompted[1]!r} "
                    f"where its generation prompt writes {f.unprompted[0]!r} first: the model trains on a form it "
                    f"never writes at inference; data.template=deepseek_r1 writes R1's turns as the model does")
    form = f.history_reasoned if with_reasoning else f.history
    several = sum(1 for n in turns if n > 1)
    if d.multi_turn == "spans" and several and form:
        said.append(f"data: {key}: multi_turn=spans: in {several} conversations the assistant turns before the last "
                    f"train in the template's history form ({form[0]!r}, where the model writes {form[1]!r} after "
                    f"its generation prompt), a form the model never writes; data.multi_turn=per_turn trains each "
                    f"turn as the model writes it (its cost said at start), last trains the last turn only")
    return said
