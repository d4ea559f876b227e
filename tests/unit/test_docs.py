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
