"""The reference pages are generated from the code (docs/gen_reference.py) and cannot drift: every config key has a
description and every command's argument a help text, and the committed pages equal what the code renders now."""

import argparse
import importlib.util
from pathlib import Path

import pytest
from pydantic import BaseModel

from scaletrain.config.schema import Config

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys(model: type[BaseModel] = Config, prefix: str = ""):
    for name, field in model.model_fields.items():
        yield prefix + name, field
        for inner in (field.annotation, *getattr(field.annotation, "__args__", ())):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                yield from _keys(inner, f"{prefix}{name}.")


def test_every_config_key_has_a_description():
    missing = [key for key, field in _keys() if not (field.description or "").strip()]
    assert len(list(_keys())) > 140
    assert missing == [], f"config keys without Field(description=...): {missing}"


def _actions(parser: argparse.ArgumentParser, name: str = "scaletrain"):
    gen = _generator()
    for a in parser._actions:
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            yield name, a
    for sub_name, _, sub in gen._subcommands(parser):
        yield from _actions(sub, f"{name} {sub_name}")


def test_every_command_argument_has_help():
    from scaletrain.cli import build_parser

    missing = [f"{cmd} {a.option_strings or a.dest}" for cmd, a in _actions(build_parser()) if not a.help]
    assert missing == [], f"arguments without help=: {missing}"


@pytest.mark.parametrize("page", ["config", "cli"])
def test_the_reference_page_is_what_the_code_renders_now(page):
    gen = _generator()
    assert gen.PAGES[page].read_text() == gen.RENDER[page](), (
        f"{gen.PAGES[page]} is stale: run make reference (python docs/gen_reference.py) and commit it")


def test_the_config_page_names_every_key_with_its_default_and_allowed_values():
    text = (DOCS / "reference" / "config.md").read_text()
    assert "| `lr_scheduler_type` | enum | `linear` | `linear`, `cosine`, `constant`, `constant_with_warmup` |" in text
    assert "| `max_length` | int | `128` | >= 8 |" in text and "(also `cutoff_len`)" in text
    assert "## `monitor.alerts`" in text and "## `fault_tolerance.chaos`" in text
