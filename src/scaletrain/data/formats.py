"""Records in LLaMA-Factory's formats -> conversations (lists of {role, content} messages).

``alpaca``: instruction / input / output, plus optional ``system`` and ``history`` ([[query, reply], ...])
columns. ``sharegpt``: a list of turns with configurable role/content tags (``from``/``value``,
``human``/``gpt``, ``system``, ``observation``/``function_call``). ``messages``: OpenAI-style ``role``/
``content`` lists, with ``tool_calls`` and ``role: tool`` results. ``text``: plain text for continued
pre-training (no conversation; loss on every token).

Tools, in the form ``apply_chat_template`` takes them: a ``tools`` column (LLaMA-Factory's name: a JSON list of
function schemas) becomes the conversation's declarations (``{"type": "function", "function": schema}``); a
sharegpt ``function_call`` turn (``{"name", "arguments"}`` JSON, or a list of them) becomes an assistant message
with ``tool_calls``, an ``observation`` turn a ``tool`` message. A call without an id gets a deterministic
9-character one (Mistral's templates require them), and a result without one the id of its call.

A conversation that cannot be trained on (roles out of order, an empty or missing turn, an unknown role, no
reply to learn) is not trained on: ``to_conversation`` says why, and the caller skips and counts it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from scaletrain.config.schema import DataConfig
from scaletrain.data.parts import from_parts, is_parts, loss_weight

FORMATTINGS = ("alpaca", "sharegpt", "messages", "text")
REASONING = "reasoning_content"  # an assistant turn's reasoning as its own field (OpenAI/DeepSeek, Qwen3's templates)
# Every name users give an assistant turn's reasoning: DeepSeek's and Qwen3's templates read reasoning_content,
# transformers' apply_chat_template and gpt-oss's template thinking, OpenRouter and vLLM's parsers reasoning. Read
# into REASONING, whichever it is (a think block in the reply is read where the template is applied).
REASONING_FIELDS = (REASONING, "thinking", "reasoning")
NOT_TRAINED = "_not_trained"  # an assistant turn the data leaves out of the loss (LLaMA-Factory v1's loss_weight 0)


@dataclass(frozen=True)
class Columns:
    """Where a format's fields live in a record (LLaMA-Factory's ``columns`` and ``tags``)."""

    prompt: str = "instruction"
    query: str = "input"
    response: str = "output"
    history: str = "history"
    system: str = "system"
    messages: str = "conversations"
    text: str = "text"
    role_tag: str = "from"
    content_tag: str = "value"
    user_tag: str = "human"
    assistant_tag: str = "gpt"
    system_tag: str = "system"
    observation_tag: str = "observation"
    function_tag: str = "function_call"
    tools: str = "tools"
    chosen: str = "chosen"  # preference data: the preferred and the dispreferred reply
    rejected: str = "rejected"
    kto_tag: str = "kto_tag"  # KTO: whether the reply is desirable
    images: str = "images"  # a vision-language model's images per record (LLaMA-Factory's column)

    @classmethod
    def from_config(cls, d: DataConfig, formatting: str) -> Columns:
        messages = d.messages_column or ("messages" if formatting == "messages" else "conversations")
        role, content, user, assistant = (("role", "content", "user", "assistant") if formatting == "messages"
                                          else ("from", "value", "human", "gpt"))
        return cls(prompt=d.instruction_column, query=d.input_column, response=d.output_column,
                   history=d.history_column, system=d.system_column, messages=messages, text=d.text_column,
                   role_tag=d.role_tag or role, content_tag=d.content_tag or content, user_tag=d.user_tag or user,
                   assistant_tag=d.assistant_tag or assistant,
                   observation_tag=d.observation_tag or ("tool" if formatting == "messages" else "observation"),
                   function_tag=d.function_tag or "function_call", tools=d.tools_column, chosen=d.chosen_column,
                   rejected=d.rejected_column, kto_tag=d.kto_tag_column, images=d.images_column)

    def with_overrides(self, columns: dict[str, str], tags: dict[str, str]) -> Columns:
        """A dataset_info.json entry's ``columns`` and ``tags`` over these."""
        from dataclasses import replace

        known = {f for f in self.__dataclass_fields__}
        updates = {k: v for k, v in {**columns, **tags}.items() if k in known}
        return replace(self, **updates)

    def required(self, formatting: str) -> dict[str, str]:
        """The columns a format cannot do without: {config key: column name}."""
        if formatting == "alpaca":
            return {"instruction_column": self.prompt, "output_column": self.response}
        if formatting == "text":
            return {"text_column": self.text}
        return {"messages_column": self.messages}


@dataclass
class Chat:
    """A conversation as chat templates take it: messages, and the tools it declares (None: none)."""

    messages: list[dict]
    tools: list[dict] | None = None
    has_tool_turns: bool = field(default=False)

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) or self.has_tool_turns


def to_conversation(row: dict[str, Any], formatting: str, c: Columns) -> tuple[Chat | None, str]:
    """(the conversation, "") or (None, the reason the record is skipped)."""
    tools, why = _tools(row.get(c.tools), c.tools)
    if why:
        return None, why
    messages, why = _alpaca(row, c) if formatting == "alpaca" else _turns(row, formatting, c)
    if messages is None:
        return None, why
    turns = any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
    return Chat(messages, tools, turns), ""


def _text(value) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _system(row: dict, c: Columns) -> list[dict]:
    """The system column as written (never stripped: its spaces are tokens of the prompt)."""
    value = row.get(c.system)
    return [{"role": "system", "content": value}] if _text(value) else []


def _tools(value, column: str) -> tuple[list[dict] | None, str]:
    """The ``tools`` column: a JSON list (or a list) of function schemas, as ``{"type": "function", ...}``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            return None, f"'{column}' is not JSON ({e.msg})"
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        return None, f"'{column}' is not a list of function schemas"
    return [t if t.get("type") == "function" and "function" in t else {"type": "function", "function": t}
            for t in value] or None, ""


def _alpaca(row: dict, c: Columns) -> tuple[list[dict] | None, str]:
    instruction, reply = _text(row.get(c.prompt)), _text(row.get(c.response))
    if instruction is None:
        return None, f"empty or missing '{c.prompt}'"
    if reply is None:
        return None, f"empty or missing '{c.response}'"
    messages = _system(row, c)
    for pair in row.get(c.history) or []:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and _text(pair[0]) and _text(pair[1])):
            return None, f"a '{c.history}' entry that is not a [query, reply] pair"
        messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    extra = _text(row.get(c.query))
    # "content" for every template; instruction/input apart for alpaca's own "### Input:" section.
    user = {"role": "user", "content": f"{row[c.prompt]}\n{row[c.query]}" if extra else row[c.prompt],
            "instruction": row[c.prompt], "input": row[c.query] if extra else ""}
    return messages + [user, {"role": "assistant", "content": row[c.response]}], ""


# Which turn may follow which: a call is answered by tool results, results by more results or a reply.
_NEXT = {None: ("user",), "system": ("user",), "user": ("assistant", "call"), "assistant": ("user",),
         "call": ("tool",), "tool": ("tool", "assistant", "call")}


def _turns(row: dict, formatting: str, c: Columns) -> tuple[list[dict] | None, str]:
    turns = row.get(c.messages)
    if not isinstance(turns, list) or not turns:
        return None, f"'{c.messages}' is not a list of turns"
    side = {c.user_tag: "user", c.observation_tag: "tool", c.assistant_tag: "assistant",
            c.function_tag: "call", c.system_tag: "system"}
    messages = _system(row, c)
    last = "system" if messages else None
    calls: list[dict] = []  # the open calls, whose results come next
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return None, f"turn {i} is not an object"
        tag, content = turn.get(c.role_tag), turn.get(c.content_tag)
        kind = side.get(tag)
        if kind is None:
            return None, f"turn {i} has unknown role {tag!r}"
        if is_parts(content):  # typed parts (LLaMA-Factory v1, OpenAI): text, reasoning, tool calls (data/parts.py)
            turn, why = from_parts(turn, c.content_tag, i, tag)
            if why:
                return None, why
            content = turn[c.content_tag]
        weight, why = loss_weight(turn, i, tag)
        if why:
            return None, why
        if kind == "assistant" and turn.get("tool_calls"):  # OpenAI-style: the calls in the assistant message
            kind = "call"
        if kind == "system":
            if messages:
                return None, f"turn {i} is a system prompt after the conversation started"
            if _text(content) is None:
                return None, f"turn {i} ({tag}) is empty"
            messages.append({"role": "system", "content": content})
            last = "system"
            continue
        if kind not in _NEXT[last]:
            expected = " or ".join({"call": "function_call", "tool": "observation"}.get(k, k) for k in _NEXT[last])
            return None, f"turn {i} ({tag}) is out of order: expected a {expected} turn"
        if kind == "call":
            message, why = _call_message(turn, content, i, tag, row)
            if why:
                return None, why
            calls = list(message["tool_calls"])
        elif content is not None and not isinstance(content, str) and not (kind == "tool" and isinstance(
                content, (dict, list))):
            return None, f"turn {i} ({tag}): '{c.content_tag}' is {_kind(content)}, not text"
        elif _text(content) is None and not (kind == "tool" and isinstance(content, (dict, list))):
            return None, f"turn {i} ({tag}) is empty"
        elif kind == "tool":
            call = calls.pop(0) if calls else None
            message = {"role": "tool", "content": content if isinstance(content, str) else json.dumps(content),
                       "tool_call_id": turn.get("tool_call_id") or (call["id"] if call else _call_id(row, i, ""))}
        else:
            message = {"role": kind, "content": content}
        if kind in ("assistant", "call"):
            reasoning, why = _reasoning(turn, content, i, tag)
            if why:
                return None, why
            if reasoning:
                message[REASONING] = reasoning  # beside the reply, under the name the templates read
            if weight == 0:
                message[NOT_TRAINED] = True  # v1's loss_weight 0: in the prompt, out of the loss (encode.py)
        messages.append(message)
        last = kind
    if last not in ("assistant", "call"):
        return None, "the conversation does not end with an assistant turn"
    return messages, ""


def _reasoning(turn: dict, content, i: int, tag: str) -> tuple[str | None, str]:
    """An assistant turn's reasoning from whichever of REASONING_FIELDS it has; a reasoning that is not text, two
    fields that say different things, or a field beside a think block in the reply is the record's skip reason
    (said with its row), never a guess."""
    given = {k: turn[k] for k in REASONING_FIELDS if turn.get(k) is not None}
    for k, v in given.items():
        if not isinstance(v, str):
            return None, f"turn {i} ({tag}): '{k}' is {_kind(v)}, not text"
    texts = {v.strip() for v in given.values() if v.strip()}
    if len(texts) > 1:
        return None, f"turn {i} ({tag}): {' and '.join(repr(k) for k in given)} hold different reasoning; keep one"
    if texts and isinstance(content, str) and "</think>" in content:
        field = next(k for k, v in given.items() if v.strip())
        return None, f"turn {i} ({tag}): reasoning both in '{field}' and as a think block in the reply; keep one"
    return (texts.pop() if texts else None), ""


def _kind(value) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__)


def _call_message(turn: dict, content, i: int, tag: str, row: dict) -> tuple[dict, str]:
    """An assistant message with ``tool_calls``: OpenAI's own, or a sharegpt ``function_call`` turn's JSON."""
    if turn.get("tool_calls"):
        raw, text = turn["tool_calls"], content if isinstance(content, str) else ""
    else:
        try:
            raw, text = json.loads(content) if isinstance(content, str) else content, ""
        except json.JSONDecodeError:
            return {}, f"turn {i} ({tag}) is not JSON {{\"name\", \"arguments\"}}"
    raw = raw if isinstance(raw, list) else [raw]
    calls = []
    for k, call in enumerate(raw):
        f = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            return {}, f"turn {i} ({tag}): call {k} has no function name"
        args = f.get("arguments", {})
        if isinstance(args, str):  # kept as written: a template that writes a string as given (Qwen3's) trains the
            try:                   # call the model writes; one that takes a mapping gets it parsed (template_input)
                json.loads(args) if args.strip() else None
            except json.JSONDecodeError:
                return {}, f"turn {i} ({tag}): the arguments of '{f['name']}' are not JSON"
            args = args if args.strip() else {}
        call_id = call.get("id") if isinstance(call.get("id"), str) else _call_id(row, i, f"{k}:{f['name']}")
        calls.append({"type": "function", "id": call_id, "function": {"name": f["name"], "arguments": args}})
    return {"role": "assistant", "content": text, "tool_calls": calls}, ""


def _call_id(row: dict, turn: int, what: str) -> str:
    """A deterministic 9-character alphanumeric id for a call the data gives none (Mistral's templates need one)."""
    digest = hashlib.sha1(f"{json.dumps(row, sort_keys=True, default=str)}|{turn}|{what}".encode()).hexdigest()
    return digest[:9]
