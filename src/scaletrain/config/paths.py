"""The local paths of a config, made absolute at launch (relative to the working directory then, as given), so a
run directory is self-contained: ``--resume`` and ``report`` work from any directory, and a path that exists only
on the machine that started the run is named as such."""

from __future__ import annotations

from pathlib import Path

# Keys whose value may be a local path (a URI, a built-in model, a hub id, a built-in template or profile name is
# left as it is).
PATH_KEYS = ("model.name_or_path", "data.train_file", "data.eval_file", "data.dataset_dir", "data.cache_dir",
             "data.template", "comm.profile", "output.output_dir", "storage.mirror_dir", "storage.node_dir")
# Keys that name a path only when they look like one (else a name: a hub id, a built-in template or profile).
NAMED_OR_PATH = {"model.name_or_path": (), "data.template": (".jinja", ".j2"), "comm.profile": (".yaml", ".yml")}


def _get(cfg, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


def is_local_path(key: str, value, cwd: Path) -> bool:
    if not isinstance(value, str) or not value or "://" in value or value.startswith("builtin:"):
        return False
    if key not in NAMED_OR_PATH:
        return True
    looks = value.startswith(("/", "./", "../", "~")) or value.endswith(NAMED_OR_PATH[key] or ("/",))
    return looks or (cwd / value).expanduser().exists()


def absolute_paths(cfg, cwd: Path | None = None):
    """``cfg`` with every local path absolute (``~`` expanded, relative to ``cwd``, default the working directory)."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    updates: dict[str, dict] = {}
    for dotted in PATH_KEYS:
        value = _get(cfg, dotted)
        if is_local_path(dotted, value, cwd) and not Path(value).expanduser().is_absolute():
            section, key = dotted.split(".")
            updates.setdefault(section, {})[key] = str((cwd / Path(value).expanduser()).resolve())
        elif is_local_path(dotted, value, cwd) and value.startswith("~"):
            section, key = dotted.split(".")
            updates.setdefault(section, {})[key] = str(Path(value).expanduser())
    funcs = [_absolute_reward(f, cwd) for f in cfg.rl.reward_funcs]  # path/to/file.py:function
    if funcs != cfg.rl.reward_funcs:
        updates["rl"] = {"reward_funcs": funcs}
    if not updates:
        return cfg
    return cfg.model_copy(update={s: getattr(cfg, s).model_copy(update=u) for s, u in updates.items()})


def _absolute_reward(spec: str, cwd: Path) -> str:
    """A user reward function's file made absolute (a built-in's name is left as it is)."""
    if ":" not in spec:
        return spec
    path, fn = spec.rsplit(":", 1)
    return f"{(cwd / Path(path).expanduser()).resolve()}:{fn}" if not Path(path).is_absolute() else spec


def missing_paths(cfg, keys: tuple[str, ...] = PATH_KEYS) -> list[str]:
    """``key=path`` of the absolute local input paths of ``cfg`` that do not exist here (outputs are made)."""
    inputs = [k for k in keys if k not in ("output.output_dir", "data.cache_dir", "storage.mirror_dir",
                                           "storage.node_dir")]
    return [f"{k}={_get(cfg, k)}" for k in inputs if is_local_path(k, _get(cfg, k), Path("/"))
            and Path(_get(cfg, k)).is_absolute() and not Path(_get(cfg, k)).exists()]
