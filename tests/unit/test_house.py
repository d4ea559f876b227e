"""House rules that keep the code base one shape: each shared name has one owner (checked on the source)."""

import ast
import functools
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "scaletrain"


def _sources(exclude: tuple[str, ...] = ()):
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith(exclude):
            yield rel, path.read_text()


@functools.lru_cache(maxsize=1)
def _string_constants() -> dict[str, list[str]]:
    """Every string constant of the sources but rundir.py (stripped of slashes) -> where it is: parsed once for
    the tests below, not once each."""
    found: dict[str, list[str]] = {}
    for rel, text in _sources(exclude=("rundir.py",)):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.setdefault(node.value.strip("/"), []).append(f"{rel}:{node.lineno}")
    return found


@pytest.mark.parametrize("name", ["summary.json", "metrics.jsonl", "config.resolved.yaml", "alerts.jsonl",
                                  "main.log", "launch.json", "heartbeat", "checkpoints"])
def test_run_directory_names_are_spelled_only_in_rundir(name):
    constants = _string_constants()
    offenders = constants.get(name, []) + constants.get(f"logs/{name}", [])
    assert offenders == [], f"{name!r} spelled outside rundir.py: {offenders}"


def test_only_the_registry_reads_or_changes_the_environment():
    pattern = re.compile(r"\bos\.(environ|getenv|putenv|unsetenv)\b")
    offenders = [f"{rel}:{n}" for rel, text in _sources(exclude=("envvars.py",))
                 for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_nothing_outside_the_registry_names_a_communication_variable():
    # NCCL_*, RCCL_*, HSA_*, MASTER_PORT ... are named in envvars.py and used through its constants.
    pattern = re.compile(r"[\"'](?:NCCL|RCCL|TORCH_NCCL|HSA|GLOO|MASTER|RAY)_[A-Z_]+[\"']")
    offenders = [f"{rel}:{n}" for rel, text in _sources(exclude=("envvars.py",))
                 for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_the_registry_is_the_ground_floor():
    """envvars.py imports no scaletrain module but credentials.py (itself importing none): config/ and every
    other layer may use it without importing comm/."""
    tree = ast.parse((SRC / "envvars.py").read_text())
    own = {n.module for n in ast.walk(tree)
           if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("scaletrain")}
    assert own == {"scaletrain.credentials"}
    cred = ast.parse((SRC / "credentials.py").read_text())
    assert not [n for n in ast.walk(cred)
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("scaletrain")]


# The layers of src/scaletrain, bottom first: a package (or top-level module) imports only from its own package
# and from lower layers, never from its own layer or above. Written once, here; a new package gets its place.
LAYERS = (
    ("__init__", "errors", "console", "credentials"),
    ("envvars", "forked", "rundir", "textfile", "usercode"),
    ("redact", "storage"),
    ("config",),
    ("comm", "data"),
    ("model",),
    ("checkpoint", "metrics"),
    ("report",),
    ("memory", "scaling", "after", "rl"),
    ("worker",),
    ("launch",),
    ("commands",),
    ("cli",),
    ("__main__",),
)


def import_graph(root: Path = SRC) -> dict[str, dict[str, int]]:
    """Module -> {imported scaletrain module: line}, every import counted (top level, in functions, and under
    TYPE_CHECKING: a circle of annotations is still a circle of knowledge)."""
    mods = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        out = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                if t in mods and t != name:
                    out.setdefault(t, node.lineno)
        graph[name] = out
    return graph


def import_circles(graph: dict[str, dict]) -> list[list[str]]:
    """One circle (a -> b -> ... -> a) per strongly connected group of modules (Tarjan's algorithm)."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on.discard(group[-1])
            if len(group) > 1:
                groups.append(set(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    circles = []
    for group in groups:  # walk inside the group from its first module back to it
        start = min(group)
        path, seen = [start], {start}
        while True:
            nxt = sorted(w for w in graph[path[-1]] if w in group)
            back = start in nxt
            if back:
                break
            step = next((w for w in nxt if w not in seen), nxt[0])
            if step in seen:
                path = path[path.index(step):]
                break
            path.append(step)
            seen.add(step)
        circles.append(path + [path[0]])
    return circles


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_circle_finder_finds_a_circle_and_passes_a_tree():
    tree = {"a": {"b": 1}, "b": {"c": 1}, "c": {}}
    assert import_circles(tree) == []
    assert import_circles({**tree, "c": {"a": 3}}) == [["a", "b", "c", "a"]]


def test_no_import_circle_anywhere():
    circles = import_circles(import_graph())
    assert circles == [], "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_no_module_imports_from_its_own_layer_or_above():
    level = {unit: i for i, units in enumerate(LAYERS) for unit in units}
    graph = import_graph()
    unplaced = sorted({_unit(m) for m in graph} - set(level))
    assert unplaced == [], f"{unplaced}: not in test_house.LAYERS; give each its layer"
    upward = [f"{m}:{line} -> {t} ({_unit(m)} is layer {level[_unit(m)]}, {_unit(t)} layer {level[_unit(t)]})"
              for m, out in sorted(graph.items()) for t, line in out.items()
              if _unit(m) != _unit(t) and level[_unit(t)] >= level[_unit(m)]]
    assert upward == []


def test_the_worker_loop_reads_in_one_screen():
    tree = ast.parse((SRC / "worker" / "loop.py").read_text())
    run_loop = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_loop")
    assert run_loop.end_lineno - run_loop.lineno < 30
    sizes = {n.name: n.end_lineno - n.lineno for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert max(sizes.values()) < 60, sizes


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
@pytest.mark.loop
def test_importing_a_launcher_sets_no_environment_variable():
    import os
    import subprocess
    import sys

    code = ("import os; before = dict(os.environ); import scaletrain.launch.ray_launcher, "
            "scaletrain.launch.torchrun_launcher, scaletrain.launch.job; print(dict(os.environ) == before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={
        k: v for k, v in os.environ.items() if k != "RAY_TRAIN_V2_ENABLED"}, timeout=120)
    assert out.stdout.strip() == "True", out.stderr


ENTRY_POINTS = {"__init__", "__main__", "cli"}


def test_the_root_holds_only_entry_points_and_what_several_folders_use():
    """A module of the package root that one folder alone imports belongs in that folder (#59: model building in
    model/, after-training in after/)."""
    graph = import_graph()
    root = {m.split(".")[1] for m in graph if m.count(".") == 1 and (SRC / f"{m.split('.')[1]}.py").exists()}
    users = {r: {_unit(m) for m, out in graph.items() for t in out if t == f"scaletrain.{r}" and _unit(m) != r}
             for r in root - ENTRY_POINTS}
    lonely = {r: sorted(u) for r, u in users.items() if len(u) < 2}
    assert lonely == {}, f"root modules used by one unit only (move them there): {lonely}"
