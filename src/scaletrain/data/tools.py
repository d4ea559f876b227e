"""The tools a GRPO run's model may call (#74, TRL's ``tools=`` and ``environment_factory``): ``rl.tools``'
functions and ``rl.environment``'s public methods, each declared to the model by the schema transformers'
``get_json_schema`` makes of it (TRL's rule: the type hints and the docstring's ``Args:``), in the prompt the chat
template renders with ``tools=`` (data/prompts.py). Loaded before any worker starts, so a tool without a schema or an
environment without ``reset`` is one line; the worker calls them (rl/tools.py)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

from scaletrain.errors import ConfigError
from scaletrain.usercode import load_object

# An environment's methods that are not tools (TRL's): its reset, and the reward it owns.
NOT_TOOLS = ("reset", "get_reward")


@dataclass
class Tools:
    """``rl.tools`` by name, the environment class (or None), and every tool's schema as ``apply_chat_template``
    takes it (the functions first, then the environment's methods, in name order)."""

    functions: dict[str, Callable]
    environment: type | None
    schemas: list[dict] = field(default_factory=list)

    @property
    def owns_reward(self) -> bool:
        return self.environment is not None and callable(getattr(self.environment, "get_reward", None))


def _schema(fn: Callable, key: str, spec: str) -> dict:
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # noqa: BLE001 - transformers' own words: which argument lacks a hint or a description
        raise ConfigError(f"{key}: {spec}: no schema can be made of it ({e}); give every argument a type hint and "
                          f"a line under the docstring's Args: (TRL's rule)") from None


def environment_tools(instance) -> dict[str, Callable]:
    """An environment instance's tools: its public methods but reset and get_reward, by name."""
    return {name: member for name, member in inspect.getmembers(instance, predicate=inspect.ismethod)
            if not name.startswith("_") and name not in NOT_TOOLS}


def load_tools(rl) -> Tools | None:
    """``rl.tools`` and ``rl.environment`` loaded and declared (None: the run has neither). One environment is made
    (``Class()``, TRL's factory call) to read its methods' schemas."""
    if not rl.tools and not rl.environment:
        return None
    functions = {}
    for spec in rl.tools:
        fn = load_object(spec, "rl.tools")
        name = getattr(fn, "__name__", spec.rpartition(":")[2])
        if name in functions:
            raise ConfigError(f"rl.tools: {spec}: a tool named {name!r} is given twice; give each tool once")
        functions[name] = fn
    schemas = [_schema(fn, "rl.tools", spec) for spec, fn in zip(rl.tools, functions.values())]
    environment = None
    if rl.environment:
        spec = rl.environment
        environment = load_object(spec, "rl.environment", "class")
        if not callable(getattr(environment, "reset", None)):
            raise ConfigError(f"rl.environment: {spec}: the class has no reset method; give it reset(self, **row), "
                              f"called with the prompt's row before each completion (TRL's environment_factory)")
        try:
            instance = environment()
        except Exception as e:  # noqa: BLE001 - the user's class: its own error, in one line
            raise ConfigError(f"rl.environment: {spec}: {environment.__name__}() failed: {type(e).__name__}: {e} "
                              f"(it is made with no arguments, one per completion)") from None
        methods = environment_tools(instance)
        if not methods:
            raise ConfigError(f"rl.environment: {spec}: the class has no public method to call as a tool (reset and "
                              f"get_reward are not tools); give it one")
        for name, method in methods.items():
            if name in functions:
                raise ConfigError(f"rl.environment: {spec}: its method {name!r} has the name of a function in "
                                  f"rl.tools; rename one")
            schemas.append(_schema(method, "rl.environment", f"{spec}.{name}"))
    return Tools(functions, environment, schemas)
