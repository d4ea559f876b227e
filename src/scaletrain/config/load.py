"""YAML loading, ``section.key=value`` overrides and ``${VAR}`` interpolation.

Every failure becomes one ``ConfigError`` line naming the file, the key and the fix.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from pydantic import BaseModel, ValidationError

from scaletrain import envvars
from scaletrain.config.importers import looks_like_llamafactory
from scaletrain.config.paths import absolute_paths
from scaletrain.config.schema import Config
from scaletrain.credentials import looks_like_secret
from scaletrain.errors import ConfigError
from scaletrain.textfile import read_text

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def load_config(
    path: str | Path,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    absolute: bool = True,
) -> Config:
    """Read ``path``, apply overrides, interpolate ``${VAR}``, validate; raise ConfigError. ``absolute=False``
    keeps local paths as written (``submit``: the job resolves them in its own working directory)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found; pass the path of a YAML config")
    try:
        raw = yaml.load(read_text(path, "config file"), Loader=_UniqueKeyLoader)
    except DuplicateKey as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}: malformed YAML{where}: {problem}; fix the syntax") from None
    if raw is None:
        raise ConfigError(f"{path} is empty; it needs at least the model: and data: sections")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, data:, ...)")
    if looks_like_llamafactory(raw):
        raise ConfigError(f"{path} is a LLaMA-Factory config; convert it first: scaletrain import llamafactory "
                          f"{path} -o {path.with_name(path.stem + '-scaletrain.yaml')}")
    for item in overrides:
        apply_override(raw, item)
    raw = interpolate_env(raw, envvars.snapshot() if environ is None else environ)
    # local paths absolute, as given relative to this directory: the run directory keeps them so (self-contained)
    cfg = validate(raw, source=str(path), overrides=overrides)
    return absolute_paths(cfg) if absolute else cfg


class DuplicateKey(Exception):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's last-one-wins for a key given twice silently drops the first (two `train:` sections: the batch, the
    steps and the seed fell back to defaults); here it is an error naming the key and both lines."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise DuplicateKey(f"key '{key}' is given twice (lines {seen[key] + 1} and "
                                   f"{key_node.start_mark.line + 1}); keep one of them")
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def validate(raw: dict, source: str = "config", overrides: Sequence[str] = ()) -> Config:
    """The typed config, or one ConfigError listing every problem pydantic found, one line each; a problem in a
    key an override set is blamed on the override, not on the file."""
    try:
        return Config.model_validate(raw)
    except ValidationError as e:
        set_by = {item.partition("=")[0].strip(): item for item in overrides}
        problems = dict.fromkeys(f"{_blame(err, source, set_by)}: {_explain(err, raw)}"
                                 for err in e.errors())  # unique, in pydantic's order
        raise ConfigError("\n".join(problems)) from None


def _blame(err: dict, source: str, set_by: dict[str, str]) -> str:
    dotted = ".".join(_field_loc(err))
    for key, item in set_by.items():
        if dotted == key or dotted.startswith(key + ".") or key.startswith(dotted + ".") and dotted.count(".") > 0:
            return f"override {item!r}"
    return source


def _field_loc(err: dict) -> list[str]:
    """pydantic's location without its union members' tags (``literal['all-linear']``, ``list[str]``)."""
    return [str(p) for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))]


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "function-after", "function-before"})


def apply_override(raw: dict, item: str) -> None:
    """Apply one ``section.key=value``; the value is parsed as YAML (4, true, [a, b], 1e-4)."""
    key, sep, text = item.partition("=")
    if not sep or "." not in key:
        raise ConfigError(f"override {item!r} must look like section.key=value, e.g. scaling.num_workers=2")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    parts = key.strip().split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part} is not a section")
    node[parts[-1]] = value


def interpolate_env(value: Any, environ: Mapping[str, str], key: str = "") -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string value of a nested structure."""
    if isinstance(value, dict):
        return {k: interpolate_env(v, environ, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate_env(v, environ, f"{key}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(
            f"{key}: environment variable {name} is not set; export it or write ${{{name}:-default}}"
        )

    return _ENV_PATTERN.sub(sub, value)


# Keys users bring from other tools for a kind of parallelism scaletrain does not have: the reason, not a near key.
_EP = ("expert parallelism is not offered: the experts are sharded with the rest of each decoder block by FSDP "
       "(train.strategy: fsdp)")
ABSENT_BY_DESIGN = {"expert_parallel_size": _EP, "expert_model_parallel_size": _EP, "ep_size": _EP,
                    "expert_parallel": _EP}


def _explain(err: dict, raw: dict) -> str:
    loc = _field_loc(err)
    dotted = ".".join(loc)
    if err["type"] == "extra_forbidden" and loc[-1] in ABSENT_BY_DESIGN:
        return f"'{dotted}': {ABSENT_BY_DESIGN[loc[-1]]}; remove the key"
    if err["type"] == "extra_forbidden":
        model = _model_at(Config, loc[:-1])
        valid = list(model.model_fields) if model else []
        near = _nearest_key(loc)
        hint = f"did you mean '{near}'?" if near else f"valid keys: {', '.join(valid)}"
        return f"unknown key '{dotted}'; {hint}"
    if err["type"] == "missing":
        return f"'{dotted}' is required; add it to the config"
    msg = err["msg"].removeprefix("Value error, ")
    if loc and err["type"] in ("model_type", "model_attributes_type", "dict_type") and _model_at(Config, loc):
        return f"section '{dotted}' is {_value_at(raw, loc)!r}; it must be a mapping of its keys ({dotted}: {{...}})"
    if not loc or _model_at(Config, loc) is not None:  # a rule of the root or of a whole section: its own words
        return msg
    return f"{dotted}={_value_at(raw, loc)!r} is not valid: {msg}"


def _nearest_key(loc: list[str]) -> str | None:
    """The valid dotted key nearest to an unknown one, looking in its own section and in every other
    (``train.save_steps`` -> ``checkpoint.save_steps``); the own section wins a tie."""
    parent, name = loc[:-1], loc[-1]
    model = _model_at(Config, parent)
    candidates = [".".join([*parent, f]) for f in (model.model_fields if model else [])]
    if len(parent) == 1:  # a key of a section: the same name in another section is a likely slip
        for section, field in Config.model_fields.items():
            sub = field.annotation
            if section != parent[0] and isinstance(sub, type) and issubclass(sub, BaseModel):
                candidates += [f"{section}.{f}" for f in sub.model_fields]
    scored = [(difflib.SequenceMatcher(None, name, c.rsplit(".", 1)[-1]).ratio(), -i, c)
              for i, c in enumerate(candidates)]
    best = max(scored, default=None)
    return best[2] if best and best[0] >= 0.5 else None


def _model_at(model: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    for part in loc:
        field = model.model_fields.get(part)
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def _value_at(raw: Any, loc: list[str]) -> Any:
    for part in loc:
        if isinstance(raw, dict) and part in raw:
            raw = raw[part]
        else:
            return None
    return raw


def literal_secrets(path: str | Path) -> list[str]:
    """Dotted keys of a config file whose value is a credential written out (not a ``${VAR}`` reference)."""
    try:
        raw = yaml.safe_load(read_text(path, "config file"))
    except (ConfigError, yaml.YAMLError):
        return []  # load_config reports those
    found: list[str] = []

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{key}[{i}]")
        elif isinstance(node, str) and "${" not in node and looks_like_secret(key.rsplit(".", 1)[-1], node):
            found.append(key)

    walk(raw, "")
    return found


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
