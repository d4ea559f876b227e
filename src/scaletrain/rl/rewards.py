"""The reward functions of train.stage: grpo: built-ins users need first, and user functions named
``path/to/file.py:function`` with TRL's reward-function signature, so a TRL user's reward file works unchanged:

    def reward(prompts, completions, completion_ids, **kwargs) -> list[float | None]

``prompts`` and ``completions`` as the data gave the prompt (text, or a list of messages: then each completion is
``[{"role": "assistant", "content": text}]``), the data's other columns as keyword arguments (one value per
completion). None means "not applicable" (TRL's): a completion every function returned None for is unscorable.
What a function returns is checked: a list of the completions' length, of numbers or None, none of them NaN; a
function that raises is named with the example; each is one line.
"""

from __future__ import annotations

import math
import re
from typing import Callable

from scaletrain.errors import ConfigError, TrainingError
from scaletrain.usercode import load_object

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*(?:\.\d+)?")
_FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.S)


def completion_text(completion) -> str:
    """A completion's text: a string, or TRL's conversational form [{"role": "assistant", "content": ...}]."""
    if isinstance(completion, list):
        return "".join(m.get("content") or "" for m in completion if isinstance(m, dict))
    return completion if isinstance(completion, str) else str(completion)


def final_answer(text: str) -> str | None:
    """The answer a completion ends with: inside <answer> tags, else the last \\boxed{}, else the last number."""
    if m := _ANSWER_TAG.findall(text):
        return m[-1].strip()
    if m := _BOXED.findall(text):
        return m[-1].strip()
    if m := _NUMBER.findall(text):
        return m[-1].replace(",", "")
    return None


def _same(pred: str | None, gold: str) -> bool:
    if pred is None:
        return False
    try:
        return math.isclose(float(pred), float(str(gold).replace(",", "").strip()), rel_tol=0, abs_tol=1e-9)
    except ValueError:
        return pred.strip() == str(gold).strip()


def accuracy(completions, answer=None, **_) -> list[float | None]:
    """1 where the completion's final answer equals the data's answer (Hugging Face's math-verify where installed:
    LaTeX and expressions compared as math; else the extracted answer compared as a number or text), 0 where not,
    None where the data has no answer."""
    try:
        from math_verify import parse, verify
    except ImportError:
        parse = verify = None
    golds = answer if answer is not None else [None] * len(completions)
    out = []
    for completion, gold in zip(completions, golds):
        if gold is None or str(gold).strip() == "":
            out.append(None)
            continue
        text = completion_text(completion)
        if parse is not None:
            p, v = _math_verify(parse, verify)
            target = p(f"${gold}$") or p(str(gold))
            extracted = final_answer(text)
            guess = p(text) if extracted is None else (p(f"${extracted}$") or p(text))
            out.append(1.0 if target and guess and v(target, guess) else 0.0)
        else:
            out.append(1.0 if _same(final_answer(text), gold) else 0.0)
    return out


def _math_verify(parse, verify):
    """math-verify's parse and verify, with their signal.alarm timeouts only where signals work (the main thread;
    a worker run in the driver's own thread has none: there without a timeout, and without its note on each call)."""
    import functools
    import logging
    import threading

    if threading.current_thread() is threading.main_thread():
        return parse, verify
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return functools.partial(parse, parsing_timeout=None), functools.partial(verify, timeout_seconds=None)


def format_reward(completions, **_) -> list[float]:
    """1 for a completion of the form <think>...</think><answer>...</answer> (open-r1's format reward), else 0."""
    return [1.0 if _FORMAT.match(completion_text(c)) else 0.0 for c in completions]


def length_penalty(completions, completion_ids=None, max_completion_length: int = 256, **_) -> list[float]:
    """DAPO's soft overlong punishment: 0 up to the last quarter of max_completion_length, then falling linearly to
    -1 at it."""
    cache = max(1, max_completion_length // 4)
    start = max_completion_length - cache
    lengths = [len(ids) for ids in completion_ids] if completion_ids is not None else \
        [len(completion_text(c).split()) for c in completions]
    return [0.0 if n <= start else max(-1.0, (start - n) / cache) for n in lengths]


BUILTINS: dict[str, Callable] = {"accuracy": accuracy, "format": format_reward, "length": length_penalty}


def load(spec: str) -> Callable:
    """The function ``spec`` names: a built-in, or path/to/file.py:function (one line when it cannot be had)."""
    if spec in BUILTINS:
        return BUILTINS[spec]
    return load_object(spec, "rl.reward_funcs")


def name_of(spec: str) -> str:
    """How a reward function is named in the metrics (rewards/NAME/mean): TRL's, the function's own name."""
    return spec.rpartition(":")[2] if ":" in spec else spec


def call(spec: str, fn: Callable, prompts: list, completions: list, completion_ids: list, columns: dict,
         first_index: int = 0, **extra) -> list[float]:
    """``fn``'s rewards (NaN for None), checked: one line naming the function (and the example) otherwise."""
    kwargs = {**columns, **extra}
    try:
        out = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
    except TypeError as e:
        if "missing" in str(e) and "argument" in str(e):
            raise TrainingError(f"rl.reward_funcs: {spec}: {e} (the data's columns: "
                                f"{', '.join(sorted(columns)) or 'none'}); give the data that column") from None
        raise TrainingError(f"rl.reward_funcs: {spec} raised at example {first_index}: TypeError: {e}") from None
    except Exception as e:  # noqa: BLE001 - the user's function: what it raised is named, with the example
        raise TrainingError(f"rl.reward_funcs: {spec} raised at example {first_index}: {type(e).__name__}: {e}") \
            from None
    if not isinstance(out, (list, tuple)) or len(out) != len(completions):
        size = len(out) if isinstance(out, (list, tuple)) else type(out).__name__
        raise TrainingError(f"rl.reward_funcs: {spec} returned {size} for {len(completions)} completions; return a "
                            f"list with one reward (a number or None) per completion")
    values = []
    for i, v in enumerate(out):
        if v is None:
            values.append(math.nan)
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(float(v)):
            raise TrainingError(f"rl.reward_funcs: {spec} returned {v!r} for example {first_index + i}; a reward "
                                f"is a number (or None: not applicable)")
        else:
            values.append(float(v))
    return values


def check(cfg) -> str:
    """Before any worker starts (launch/preflight.py): every reward function loads, and the rollout engine is one this
    machine has; the note said at start (the engine, its placement, the rewards)."""
    import importlib.util

    from scaletrain.data.tools import load_tools

    for spec in cfg.rl.reward_funcs:
        load(spec)
    tools = load_tools(cfg.rl)
    if cfg.train.stage == "grpo" and not cfg.rl.reward_funcs and not (tools and tools.owns_reward):
        raise ConfigError(f"rl.environment: {cfg.rl.environment}: the class has no get_reward method and "
                          f"rl.reward_funcs is empty, so nothing scores a completion; give the class get_reward(self) "
                          f"or set rl.reward_funcs")
    r = cfg.rollout
    if r.engine == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("rollout.engine=vllm: vLLM is not installed here (it runs on GPUs: pip install "
                              "'scaletrain[vllm]' on a GPU machine), or use rollout.engine: hf")
        import torch

        if cfg.scaling.launcher in ("local", "torchrun") and not torch.cuda.is_available():
            raise ConfigError(f"rollout.engine=vllm needs a GPU and scaling.launcher={cfg.scaling.launcher} runs the "
                              f"workers on this machine, which has none; use rollout.engine: hf")
    lora = cfg.model.finetuning_type == "lora"
    sent = ("the adapter as peft's files" if lora and r.engine == "vllm" else
            "the whole model once, then the LoRA adapter only" if lora else "the whole model")
    placement = (f"colocated: each worker's own vLLM, given the {'adapter' if lora else 'weights'} after every "
                 f"step, {r.gpu_memory_utilization:g} of its GPU's memory, handed back between rollouts"
                 if r.engine == "vllm" and r.placement == "colocated" else
                 "colocated: each worker samples its own prompts with the policy it trains" if r.placement ==
                 "colocated" else f"separate: {r.num_workers} Ray actor(s) of their own, given the policy before "
                 f"each rollout ({sent}"
                 f"; each wait at most rollout.sync_timeout_s={r.sync_timeout_s:g} s)")
    names = ", ".join(f"{name_of(s)} x {w:g}" for s, w in zip(cfg.rl.reward_funcs, cfg.rl.reward_weights or
                                                                [1.0] * len(cfg.rl.reward_funcs)))
    if tools and tools.owns_reward:
        names = ", ".join(filter(None, [names, f"{tools.environment.__name__}.get_reward x 1"]))
    if tools:
        rounds = cfg.rl.max_tool_calling_iterations
        names += (f"; tools {', '.join(s['function']['name'] for s in tools.schemas)}, up to "
                  f"{'any number of' if rounds is None else rounds} round(s) of calls, their replies out of the loss")
    return (f"rl: {cfg.rl.loss_type} loss, {cfg.rl.num_generations} completions per prompt of up to "
            f"{cfg.rl.max_completion_length} tokens, rewards {names}, advantages scaled per {cfg.rl.scale_rewards}, "
            f"beta {cfg.rl.beta:g}; rollout: {r.engine} ({placement}, seeded per prompt)")
