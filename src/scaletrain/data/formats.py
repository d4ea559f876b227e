"""Records in LLaMA-Factory's formats -> conversations (lists of {role, content} messages).

``alpaca``: instruction / input / output, plus optional ``system`` and ``history`` ([[query, reply], ...])
columns. ``sharegpt``: a list of turns with configurable role/content tags (``from``/``value``,
``human``/``gpt``, ``system``, ``observation``/``function_call``). ``messages``: OpenAI-style ``role``/
``content`` lists. ``text``: plain text for continued pre-training (no conversation; loss on every token).

A conversation that cannot be trained on (roles out of order, an empty or missing turn, an unknown role, no
reply to learn) is not trained on: ``to_conversation`` says why, and the caller skips and counts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scaletrain.config.schema import DataConfig

FORMATTINGS = ("alpaca", "sharegpt", "messages", "text")


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

    @classmethod
    def from_config(cls, d: DataConfig, formatting: str) -> Columns:
        messages = d.messages_column or ("messages" if formatting == "messages" else "conversations")
        role, content, user, assistant = (("role", "content", "user", "assistant") if formatting == "messages"
                                          else ("from", "value", "human", "gpt"))
        return cls(prompt=d.instruction_column, query=d.input_column, response=d.output_column,
                   history=d.history_column, system=d.system_column, messages=messages, text=d.text_column,
                   role_tag=d.role_tag or role, content_tag=d.content_tag or content, user_tag=d.user_tag or user,
                   assistant_tag=d.assistant_tag or assistant,
                   observation_tag=d.observation_tag or ("tool" if formatting == "messages" else "observation"))

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


def to_conversation(row: dict[str, Any], formatting: str, c: Columns) -> tuple[list[dict] | None, str]:
    """(messages, "") or (None, the reason the record is skipped)."""
    if formatting == "alpaca":
        return _alpaca(row, c)
    return _turns(row, formatting, c)


def _text(value) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _alpaca(row: dict, c: Columns) -> tuple[list[dict] | None, str]:
    instruction, reply = _text(row.get(c.prompt)), _text(row.get(c.response))
    if instruction is None:
        return None, f"empty or missing '{c.prompt}'"
    if reply is None:
        return None, f"empty or missing '{c.response}'"
    messages = []
    if system := _text(row.get(c.system)):
        messages.append({"role": "system", "content": system})
    for pair in row.get(c.history) or []:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and _text(pair[0]) and _text(pair[1])):
            return None, f"a '{c.history}' entry that is not a [query, reply] pair"
        messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    extra = _text(row.get(c.query))
    # "content" for every template; instruction/input apart for alpaca's own "### Input:" section.
    user = {"role": "user", "content": f"{row[c.prompt]}\n{row[c.query]}" if extra else row[c.prompt],
            "instruction": row[c.prompt], "input": row[c.query] if extra else ""}
    return messages + [user, {"role": "assistant", "content": row[c.response]}], ""


def _turns(row: dict, formatting: str, c: Columns) -> tuple[list[dict] | None, str]:
    turns = row.get(c.messages)
    if not isinstance(turns, list) or not turns:
        return None, f"'{c.messages}' is not a list of turns"
    side = {c.user_tag: "user", c.observation_tag: "user", c.assistant_tag: "assistant",
            c.function_tag: "assistant", c.system_tag: "system"}
    messages = []
    if system := _text(row.get(c.system)):
        messages.append({"role": "system", "content": system})
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return None, f"turn {i} is not an object"
        tag, content = turn.get(c.role_tag), turn.get(c.content_tag)
        if tag not in side:
            return None, f"turn {i} has unknown role {tag!r}"
        if _text(content) is None:
            return None, f"turn {i} ({tag}) is empty"
        role = side[tag]
        if role == "system":
            if messages:
                return None, f"turn {i} is a system prompt after the conversation started"
            messages.append({"role": "system", "content": content})
            continue
        expected = "user" if not messages or messages[-1]["role"] in ("system", "assistant") else "assistant"
        if role != expected:
            return None, f"turn {i} ({tag}) is out of order: expected a {expected} turn"
        messages.append({"role": role, "content": content})
    if not messages or messages[-1]["role"] != "assistant":
        return None, "the conversation does not end with an assistant turn"
    return messages, ""
