"""Multi-turn tool rollouts (#74, TRL 1.13's ``GRPOTrainer(tools=, environment_factory=)`` and its
``_tool_call_loop``): what a completion's tool calls are, what the tools answer, and the tokens that put the answers
in the context. The loop that samples again after them is the worker's (worker/tool_rollouts.py).

- **The calls** are read in the form the run's chat template writes them (``call_format``: the template renders a
  probe call, and its form is read off the text): Qwen's and Hermes' ``<tool_call>{json}</tool_call>``, Mistral's
  ``[TOOL_CALLS] [...]``, Llama 3.1's bare ``{"name", "parameters"}``. Written here rather than with transformers'
  ``parse_response``: that needs a response schema the released tokenizers of these models do not carry (TRL adds
  one per known template). A call whose JSON does not parse is no call (TRL's: the turn is plain text).
- **The answers**: each call's function (``rl.tools``, or the row's environment's method) with its arguments; what
  it returns becomes the tool message's content (``str()``, TRL's); a call that raises, or names no tool, answers
  ``{'error': '...'}`` with its error text and is counted (TRL's ``tools/failure_frequency``).
- **The tokens** after a completion that called: TRL's ``_get_tool_suffix_ids``: a conversation that ends in a call
  rendered with and without the tool messages (and the next generation prompt), the difference tokenized; the
  completion's own tokens are never re-tokenized, so what was sampled is what trains.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

from scaletrain.data.tools import Tools, environment_tools
from scaletrain.errors import ConfigError, TrainingError

_PROBE = "scaletrain_probe"
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
FORMATS = ("hermes", "mistral", "llama_json")


@functools.lru_cache(maxsize=8)
def call_format(template: str) -> str:
    """How ``template`` writes an assistant's tool call: one of FORMATS (one line when none of them)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    tool = {"type": "function", "function": {"name": _PROBE, "description": "A probe.",
                                             "parameters": {"type": "object", "properties": {}}}}
    call = {"type": "function", "id": "abcdefghi", "function": {"name": _PROBE, "arguments": {"x": 1}}}
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    try:
        (text,), _ = render_jinja_template([chat], tools=[tool], chat_template=template, bos_token="", eos_token="")
    except Exception as e:  # noqa: BLE001 - the template's own refusal, in its words
        raise ConfigError(f"rl.tools: the chat template cannot render a tool call ({e}); set data.template to the "
                          f"model's own template (it must write tool calls and tool replies)") from None
    if "<tool_call>" in text:
        return "hermes"
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if re.search(r'\{"name": "' + _PROBE + r'", "parameters"', text):
        return "llama_json"
    raise ConfigError("rl.tools: the chat template writes tool calls in a form scaletrain does not read yet (it "
                      "reads <tool_call> as Qwen and Hermes write it, Mistral's [TOOL_CALLS] and Llama 3.1's JSON); "
                      "use a template of those (data.template)")


def _call(obj) -> dict | None:
    """A call as chat templates take it, from a parsed ``{"name", "arguments" | "parameters"}``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return {"type": "function", "function": {"name": obj["name"], "arguments": args}}


def parse_calls(text: str, fmt: str) -> tuple[str, list[dict]]:
    """(the turn's text before its calls, its calls) of a sampled assistant turn (its end-of-turn token removed);
    no calls when a call's JSON does not parse."""
    try:
        if fmt == "hermes":
            found = _HERMES.findall(text)
            calls = [_call(json.loads(x)) for x in found]
            return (text.split("<tool_call>")[0] if found else text), (calls if found and all(calls) else [])
        if fmt == "mistral":
            head, marker, tail = text.partition("[TOOL_CALLS]")
            if not marker:
                return text, []
            listed = json.loads(tail.strip())
            calls = [_call(x) for x in (listed if isinstance(listed, list) else [listed])]
            return head, calls if calls and all(calls) else []
        stripped = text.strip()
        if stripped.startswith("{") and stripped.endswith("}"):
            one = _call(json.loads(stripped))
            return ("", [one]) if one else (text, [])
    except json.JSONDecodeError:
        pass
    return text, []


@dataclass
class Answer:
    messages: list[dict]  # the tool messages, in the calls' order
    calls: int
    failures: int


def answer(calls: list[dict], functions: dict, environment=None) -> Answer:
    """Each call run with its arguments (``functions``, then the environment's methods); its result or its error as
    a tool message (TRL's ``{"role": "tool", "name", "content"}``)."""
    tools = {**functions, **(environment_tools(environment) if environment is not None else {})}
    messages, failures = [], 0
    for call in calls:
        name, args = call["function"]["name"], call["function"]["arguments"]
        try:
            if name not in tools:
                raise ValueError(f"Tool {name} not found.")
            result = tools[name](**args)
        except Exception as e:  # noqa: BLE001 - the model's call: what it raised is its answer (TRL's)
            failures += 1
            result = {"error": str(e)}
        messages.append({"role": "tool", "name": name, "content": result if isinstance(result, list) else str(result)})
    return Answer(messages, len(calls), failures)


class Suffixes:
    """The tokens after a completion that called tools, up to the next generation prompt (TRL's
    ``_get_tool_suffix_ids``): a conversation that ends in a call, its tool messages and the generation prompt
    rendered through the run's template, and the tokens after the call's end of turn taken. Where TRL cuts a
    rendering without the replies off the one with them (a prefix: TRL swaps in a training template where the model's
    is not prefix-preserving, as Qwen3's is not: its last assistant turn gets an empty think block), the call's end is
    found by counting end-of-turn tokens: the user turn's, then the call's. The completion's own tokens are never
    re-tokenized."""

    def __init__(self, tokenizer, template: str, variables: dict, stop: int):
        self.tokenizer, self.template, self.variables, self.stop = tokenizer, template, variables, stop

    def _render(self, chat: list[dict], generation: bool) -> list[int]:
        from transformers.utils.chat_template_utils import render_jinja_template

        (text,), _ = render_jinja_template([chat], chat_template=self.template, add_generation_prompt=generation,
                                          **self.variables)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @functools.cached_property
    def _before(self) -> int:
        """The end-of-turn tokens the template writes before the call (a default system turn, the user's)."""
        return self._render(self._dummy("f")[:1], False).count(self.stop)

    @staticmethod
    def _dummy(name: str) -> list[dict]:
        return [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "abcdefghi", "function": {"name": name, "arguments": {}}}]}]

    def __call__(self, tool_messages: list[dict]) -> list[int]:
        full = self._render(self._dummy(tool_messages[0]["name"]) + tool_messages, True)
        stops = [i for i, x in enumerate(full) if x == self.stop]
        if len(stops) <= self._before:
            raise TrainingError(f"rl.tools: the chat template does not end an assistant's tool call with the "
                                f"tokenizer's end of sequence ({self.tokenizer.convert_ids_to_tokens(self.stop)!r}), "
                                f"where a completion stops; give the tokenizer the template's end of turn as its "
                                f"eos_token")
        return full[stops[self._before] + 1:]


def environments_for(tools: Tools | None, extras: list[dict]) -> list | None:
    """One environment per completion, reset with its prompt's row (TRL's ``reset(**row)``); None without one."""
    if tools is None or tools.environment is None:
        return None
    out = []
    for i, e in enumerate(extras):
        env = tools.environment()
        said = env.reset(prompt=e["prompt"], **e["columns"])
        if said is not None:
            raise TrainingError(f"rl.environment: {tools.environment.__name__}.reset returned text for completion "
                                f"{i}; scaletrain renders every prompt in the data step, so put that text in the "
                                f"prompt's row (reset must return None)")
        out.append(env)
    return out
