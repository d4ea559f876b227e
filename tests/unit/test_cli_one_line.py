"""Every command's bad arguments are one line (#60): an unknown flag, a number that is not one, and every numeric
flag out of its range (predict --straggler-cv -1 was accepted) end in one line naming the flag, exit code 2."""

import argparse

import pytest

from scaletrain.cli import build_parser, parse


def _commands(parser=None, prefix=()):
    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
                yield from (_commands(sub, (*prefix, name)) if nested else [((*prefix, name), sub)])


COMMANDS = list(_commands())
NUMERIC = [(cmd, a.option_strings[-1]) for cmd, sub in COMMANDS for a in sub._actions
           if a.option_strings and a.type is not None and getattr(a.type, "__name__", "") in ("int", "float")]


def _one_line_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as done:
        parse(list(argv))
    err = capsys.readouterr().err
    assert done.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def test_every_numeric_flag_has_a_range():
    """No bare type=int/float is left: each numeric flag goes through commands/args.number."""
    bare = [(cmd, a.option_strings) for cmd, sub in COMMANDS for a in sub._actions if a.type in (int, float)]
    assert bare == [] and len(NUMERIC) > 40


@pytest.mark.parametrize("cmd", [c for c, _ in COMMANDS], ids=" ".join)
def test_an_unknown_flag_is_one_line(cmd, capsys):
    err = _one_line_error(capsys, [*cmd, "--no-such-flag"])
    assert f"scaletrain {cmd[-1]}" in err or "unrecognized arguments: --no-such-flag" in err


@pytest.mark.parametrize("cmd,flag", NUMERIC, ids=lambda v: " ".join(v) if isinstance(v, tuple) else v)
def test_a_numeric_flag_out_of_its_range_or_not_a_number_is_one_line(cmd, flag, capsys):
    for bad in ("-1", "nan", "x"):
        err = _one_line_error(capsys, [*cmd, flag, bad])
        assert f"argument {flag}" in err or f"/{flag}" in err, err
    assert "must be >= 0" in _one_line_error(capsys, ["predict", "--check-published", "--straggler-cv", "-1"])
