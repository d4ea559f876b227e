"""Docs that cannot drift: the troubleshooting table against the errors the code raises and the words it says, the
README's set-up commands against the Makefile, and every command in the README (the config and command reference
pages are generated: test_reference_docs.py)."""

import functools
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


TROUBLESHOOTING = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"
# The modules `train` runs before any worker starts: config, output directory, model, data, batch, plan.
PREFLIGHT = ("config/", "rundir.py", "model/build.py", "model/files.py", "model/tokenizer.py", "data/", "textfile.py",
             "launch/preflight.py", "launch/resume.py",
             "memory/plan.py", "launch/plan.py")


def _raised(paths) -> set[str]:
    import ast

    src = Path(__file__).resolve().parents[2] / "src" / "scaletrain"
    names = set()
    for p in sorted(src.rglob("*.py")):
        if p.relative_to(src).as_posix().startswith(paths):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func,
                                                                                               ast.Name):
                    names.add(node.exc.func.id)
    return names


def test_the_troubleshooting_table_has_a_row_for_every_error_the_preflight_raises():
    from scaletrain import errors

    user_errors = {n for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, errors.ScaletrainError)}
    rows = [line.split("|")[2].strip().strip("`") for line in TROUBLESHOOTING.read_text().splitlines()
            if line.startswith("| ") and line.count("|") >= 5 and "`" in line.split("|")[2]]
    raised = _raised(PREFLIGHT) & user_errors
    assert raised >= {"ConfigError", "DataError", "LaunchError"}  # the scan sees the preflight's raises
    assert sorted(raised - set(rows)) == [], "errors the preflight raises without a row in docs/troubleshooting.md"
    assert set(rows) <= user_errors, set(rows) - user_errors  # every row names a real error class
    assert sorted(user_errors - {"ScaletrainError"} - set(rows)) == []  # and every class a user meets has one


@functools.cache  # the package parsed once for the tests that read it
def _message_texts() -> str:
    """Every string the code can say, an f-string's literal parts kept apart (a value goes between them), and
    the operating system's error texts (``strerror``) that messages quote."""
    import ast
    import os

    src = Path(__file__).resolve().parents[2] / "src" / "scaletrain"
    texts = [os.strerror(n) for n in range(1, 134)]
    for p in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.JoinedStr):
                texts.append("\0".join(v.value if isinstance(v, ast.Constant) else "" for v in node.values))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append(node.value)
    return "\n".join(texts)


# In an example, a value is anything with a digit, an upper-case placeholder (DIR, FILE, NAME), a file name, a
# quoted value or a key=value / path / label: (the code fills those in); the words between values are the code's.
_VALUE = re.compile(r"^(\S*\d\S*|[A-Z][A-Z_]+\S*|\S+\.[a-z]+\S*|'[^']*'\S*|\S*[=:/]\S*|\[\S*)$")


def _phrases(example: str) -> list[str]:
    """The runs of two or more of the code's own words in a troubleshooting example."""
    out = []
    for part in re.split(r"\.\.\.|[();,]", example):
        run = []
        for word in [*part.split(), "A_VALUE"]:
            if _VALUE.match(word):
                if len(run) >= 2:
                    out.append(" ".join(run))
                run = []
            else:
                run.append(word)
    return out


def test_the_troubleshooting_examples_are_what_the_code_says():
    said = _message_texts()
    rows = [line for line in TROUBLESHOOTING.read_text().splitlines() if line.startswith("| ") and line.count("|") >= 5]
    examples = [ex for row in rows for ex in re.findall(r"`([^`]+)`", row.split("|")[3])]
    assert len(examples) > 20
    drifted = [f"{ex!r}: {phrase!r}" for ex in examples for phrase in _phrases(ex) if phrase not in said]
    assert drifted == [], "docs/troubleshooting.md examples the code does not say (fix the doc or the message)"


def test_a_drifted_troubleshooting_example_is_found():
    said = _message_texts()
    assert [p for p in _phrases("data.train_file=d.jsonl: line 17 is not JSON") if p not in said] == []
    assert [p for p in _phrases("data.train_file=d.jsonl: line 17 is not proper JSON") if p not in said] != []


ROOT = Path(__file__).resolve().parents[2]


def _make_target_command(target: str) -> list[str]:
    """The ``scaletrain ...`` command line of a Makefile target."""
    lines = (ROOT / "Makefile").read_text().split(f"\n{target}:", 1)[1].split("\n\n", 1)[0].splitlines()
    line = next(ln for ln in lines if "/scaletrain " in ln)
    return line.split("/scaletrain ", 1)[1].split()


def _setup_lines() -> dict[str, str]:
    """The README's two set-up commands, from its first code block: command -> its comment."""
    block = README.read_text().split("```", 2)[1]
    lines = [ln for ln in block.splitlines() if ln.strip()]
    return {ln.split("#")[0].strip(): ln.split("#", 1)[1].strip() for ln in lines}


def test_the_readme_starts_with_the_two_setup_commands():
    assert list(_setup_lines()) == ["make demo", "make test"]
    assert "make demo" in (ROOT / "Makefile").read_text() and "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_says_how_make_demo_runs(monkeypatch):
    """The launcher and worker count the README's `make demo` line names are the ones its command chooses (the
    line `train` prints at start)."""
    from scaletrain.config.load import load_config
    from scaletrain.launch import launcher

    command, config, *overrides = _make_target_command("demo")
    assert command == "train"
    monkeypatch.setattr(launcher, "fits_this_machine", lambda s: True)  # CI's 2 cores run the demo's 2 workers
    # As on a fresh machine: not the Ray an earlier integration test left joined in this pytest process.
    monkeypatch.setattr(launcher, "ray_running", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("scaletrain.launch.warm.cluster.current", lambda: None)
    cfg, note = launcher.choose_launcher(load_config(ROOT / config, overrides))
    said = _setup_lines()["make demo"]
    chosen = {"local": "in this process", "torchrun": "under torchrun", "ray": "Ray"}[cfg.scaling.launcher]
    assert chosen in said and f"{cfg.scaling.num_workers} local workers" in said, (said, note)
    assert note is None or chosen.split()[-1] in note


def _commands() -> list[str]:
    from scaletrain.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return sorted(sub.choices)


@pytest.mark.parametrize("command", _commands())
def test_every_command_is_in_the_readme_and_has_help(command, capsys):
    from scaletrain.cli import parse

    assert f"scaletrain {command}" in README.read_text(), f"the README never shows `scaletrain {command}`"
    with pytest.raises(SystemExit) as done:
        parse([command, "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: scaletrain " + command)
