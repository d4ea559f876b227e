"""Docs that cannot drift: the README's config table is held against the schema."""

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from scaletrain.config.schema import Config

README = Path(__file__).resolve().parents[2] / "README.md"


def _table() -> dict[str, set[str]]:
    """section -> the keys its row names (backticked names outside parentheses: those list allowed values)."""
    rows = {}
    for line in README.read_text().splitlines():
        m = re.match(r"\| `([a-z_.]+)` \| (.*) \|$", line)
        if not m:
            continue
        depth, outside = 0, []
        for ch in m.group(2):
            depth += ch == "("
            outside.append(ch if depth == 0 else " ")
            depth -= ch == ")"
        rows[m.group(1)] = set(re.findall(r"`([a-z_0-9]+)`", "".join(outside)))
    return rows


def _sections(model: type[BaseModel] = Config, prefix: str = "") -> dict[str, set[str]]:
    out = {}
    for name, field in model.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out[prefix + name] = set(sub.model_fields)
            out.update(_sections(sub, f"{prefix}{name}."))
    return out


@pytest.mark.parametrize("section", sorted(_sections()))
def test_the_readme_config_table_names_every_key_of_the_schema(section):
    table, schema = _table(), _sections()
    nested = {k.rsplit(".", 1)[-1] for k in schema if k.startswith(section + ".")}
    assert section in table, f"README's config table has no row for {section}"
    assert sorted(schema[section] - table[section]) == [], f"keys of {section} missing from the README's table"
    assert sorted(table[section] - schema[section] - nested) == [], f"README names keys {section} does not have"


TROUBLESHOOTING = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"
# The modules `train` runs before any worker starts: config, output directory, model, data, batch, plan.
PREFLIGHT = ("config/", "rundir.py", "model.py", "data/", "textfile.py", "launch/preflight.py", "launch/resume.py",
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
