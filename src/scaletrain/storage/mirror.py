"""A run directory on object storage: the driver's local mirror of it, uploaded as the run goes.

The driver (and everything that runs beside it: the monitor, the report, the trackers) works in a local copy of
the run directory, the mirror; ``Mirror`` uploads what changed at least every ``storage.sync_interval_s``, once
synchronously before the workers start (the config and the tokenized data they download) and once at the end.
Checkpoints never pass through it: every rank writes its shards to the store itself (checkpoint/storage.py
``ObjectStorage``). A mirror knows its home from ``store.json`` (RunDir.STORE), so ``--resume``, ``report`` and
``watch`` of a URI fetch the run into a fresh mirror first (``fetch_run``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from scaletrain.errors import LaunchError
from scaletrain.rundir import DIR_MODE, RunDir, default_run_name
from scaletrain.storage.uri import Store, explain, is_uri, probe

log = logging.getLogger("scaletrain.storage")

DEFAULT_MIRROR = "~/.cache/scaletrain/mirror"


def mirror_base(storage_cfg, store: Store) -> Path:
    """The local directory that mirrors ``store``'s URI (its runs are folders below it)."""
    root = Path(storage_cfg.mirror_dir or DEFAULT_MIRROR).expanduser()
    return (root / store.scheme / store.path).resolve()


def local_output_dir(output_dir: str, storage_cfg) -> Path:
    """Where local files that belong beside the runs go (the data cache): output_dir, or its mirror."""
    if is_uri(output_dir):
        return mirror_base(storage_cfg, Store.of(output_dir, storage_cfg.endpoint_url))
    return Path(output_dir).expanduser()


def home_of(run_dir: str | Path) -> Store | None:
    """The store a mirror belongs to (None: a local run directory)."""
    path = RunDir(run_dir).store
    if not path.is_file():
        return None
    home = json.loads(path.read_text())
    return Store(home["uri"], home.get("endpoint_url"))


def check_remote_output(output_dir: str, run_name: str | None, storage_cfg) -> Store:
    """Before anything is written: the store answers and takes a write (storage/uri.py ``probe``), and a named
    run does not exist there yet."""
    store = Store.of(output_dir, storage_cfg.endpoint_url)
    probe(store)
    if run_name and _exists(store.child(run_name)):
        raise LaunchError(f"output.run_name={run_name}: {store.child(run_name)} already exists and is never "
                          f"overwritten; choose another run_name, or continue it with --resume "
                          f"{store.child(run_name)}")
    return store


def create_remote_run(output_dir: str, run_name: str | None, config_path: str | Path, storage_cfg) -> Path:
    """A fresh run on the store and its local mirror; returns the mirror. Neither may exist yet (no run is
    overwritten, in the store or here). An object store has no atomic mkdir: the name is checked, then taken here
    by the mirror (its store.json); the store gets the run's files with the mirror's first upload, before any
    worker starts (two drivers on two machines choosing the same name before either uploads is the one race
    left)."""
    parent = Store.of(output_dir, storage_cfg.endpoint_url)
    base = mirror_base(storage_cfg, parent)
    names = [run_name] if run_name else [default_run_name(config_path)] + [
        f"{default_run_name(config_path)}-{i}" for i in range(2, 1000)]
    for name in names:
        in_store = _exists(parent.child(name))
        if (base / name).exists() or in_store:
            if run_name and not in_store:  # the run is gone from the store; this machine's copy of it is left
                raise LaunchError(f"output.run_name={run_name}: {parent.child(name)} is not in the store, but a local "
                                  f"mirror of a run of that name is left at {base / name} (the remote run was "
                                  f"removed); keep what you need from it, then remove it (rm -r {base / name}), or "
                                  f"choose another run_name")
            if run_name:
                raise LaunchError(f"output.run_name={run_name}: {parent.child(name)} already exists and is never "
                                  f"overwritten; choose another run_name, or continue it with --resume "
                                  f"{parent.child(name)}")
            continue
        base.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        (base / name).mkdir(mode=DIR_MODE)
        write_home(base / name, parent.child(name))
        return base / name
    raise LaunchError(f"output.output_dir={output_dir}: could not find a free run name")


def write_home(mirror: Path, store: Store) -> None:
    RunDir(mirror).store.write_text(json.dumps({"uri": store.uri, "endpoint_url": store.endpoint_url}))


def fetch_run(uri: str, storage_cfg, what: str = "--resume") -> Path:
    """Download a run from the store into its mirror here (the store wins over whatever an earlier driver on
    this machine left), without its checkpoints, data and final model: the workers read those from the store.
    Returns the mirror."""
    store = Store.of(uri.rstrip("/"), storage_cfg.endpoint_url)

    def mirror() -> Path:
        path = mirror_base(storage_cfg, store)
        path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        return path

    local = _download(store, uri, what, "pass the URI of an earlier run", mirror,
                      lambda rel: not _skipped_on_fetch(rel))
    write_home(local, store)
    return local


def fetch_final(uri: str, endpoint_url: str | None, dest: Path, what: str = "export") -> Path:
    """A finished run's config and final model from the store into ``dest`` (a new local directory), for the
    commands that read a run's model (`export`); nothing else of the run."""
    store = Store.of(uri.rstrip("/"), endpoint_url)
    return _download(store, uri, what, "pass the URI of a run directory", lambda: dest,
                     lambda rel: rel == RunDir.RESOLVED_CONFIG or rel.startswith(f"{RunDir.FINAL}/"))


def _download(store: Store, uri: str, what: str, hint: str, dest, keep) -> Path:
    """The files of the run at ``store`` whose path in the run ``keep`` accepts, file by file (streamed) into
    ``dest()``; a store that holds no run, or any backend error, is one line naming ``what`` and ``uri``."""
    fs = store.fs
    try:
        fs.invalidate_cache(store.path)
        if not fs.exists(f"{store.path}/{RunDir.RESOLVED_CONFIG}"):
            raise LaunchError(f"{what} {uri}: no {RunDir.RESOLVED_CONFIG} there; {hint}")
        files = [f for f in fs.find(store.path) if keep(f[len(store.path) + 1:])]
        root = dest()
        for f in files:
            target = root / f[len(store.path) + 1:]
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(f, str(target))
    except LaunchError:
        raise
    except Exception as e:  # noqa: BLE001 - each backend raises its own types; all are worded here
        raise LaunchError(f"{what} {uri}: {explain(e, store)}") from None
    return root


def upload_tree(local: Path, store: Store, key: str = "upload") -> None:
    """A local folder's files to ``store`` (the tokenized splits the workers download, an export), file by file;
    a backend error is one line naming ``key``."""
    fs, local = store.fs, Path(local)
    try:
        for p in sorted(local.rglob("*")):
            if p.is_file():
                fs.put_file(str(p), f"{store.path}/{p.relative_to(local).as_posix()}")
    except Exception as e:  # noqa: BLE001 - each backend raises its own types; all are worded here
        raise LaunchError(f"{key} {store.uri}: {explain(e, store)}") from None


def _skipped_on_fetch(rel: str) -> bool:
    return rel.split("/", 1)[0] in RunDir.NOT_FETCHED


def _exists(store: Store, key: str = "output.output_dir") -> bool:
    fs = store.fs
    fs.invalidate_cache(store.path)
    try:
        return bool(fs.exists(store.path))
    except Exception as e:  # noqa: BLE001 - worded as one line
        raise LaunchError(f"{key}={store.uri}: {explain(e, store)}") from None


def check_upload_target(uri: str, endpoint_url: str | None, key: str) -> Store:
    """A new place on the store for a finished directory (``--upload``): the store answers and takes a write where
    it will go, and nothing is there yet (an upload never overwrites). Checked before the work that makes it."""
    store = Store.of(uri.rstrip("/"), endpoint_url)
    parent = Store(store.uri.rsplit("/", 1)[0], endpoint_url) if store.uri.count("/") > 2 else store
    probe(parent, key)
    if _exists(store, key):
        raise LaunchError(f"{key}={store.uri}: exists; an upload never overwrites (choose another path or remove it)")
    return store


class Mirror:
    """Uploads a mirror's new and changed files (by size and mtime) to its store, now (``sync``) and every
    ``interval_s`` in a background thread while the run goes (``start`` ... ``close``, which syncs once more).
    A failed upload is logged and tried again at the next round: the run never stops for its mirror."""

    def __init__(self, local: Path, store: Store, interval_s: float):
        self.local, self.store, self.interval_s = Path(local), store, interval_s
        self.sent: dict[str, tuple[int, int]] = {}
        self.uploads, self.upload_s = 0, 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def changed(self) -> list[tuple[str, tuple[int, int]]]:
        out = []
        for p in sorted(self.local.rglob("*")):
            rel = p.relative_to(self.local).as_posix()
            if rel.split("/", 1)[0] in RunDir.NOT_UPLOADED or not p.is_file() or RunDir.is_partial(p.name):
                continue
            st = p.stat()
            if self.sent.get(rel) != (st.st_size, st.st_mtime_ns):
                out.append((rel, (st.st_size, st.st_mtime_ns)))
        return out

    def sync(self) -> int:
        """Upload what changed since the last sync; returns the number of files uploaded."""
        with self._lock:
            fs, started, n = self.store.fs, time.perf_counter(), 0
            for rel, stamp in self.changed():
                fs.put_file(str(self.local / rel), f"{self.store.path}/{rel}")
                self.sent[rel] = stamp
                n += 1
            self.uploads += n
            self.upload_s += time.perf_counter() - started
            return n

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync()
            except Exception as e:  # noqa: BLE001 - retried next round; the run goes on
                log.warning("upload to %s failed (%s); trying again in %.0f s", self.store, explain(e, self.store),
                            self.interval_s)

    def assume_synced(self) -> Mirror:
        """What the mirror holds now is on the store already (it was just fetched from there)."""
        self.sent.update(self.changed())
        return self

    def start(self) -> Mirror:
        self._thread = threading.Thread(target=self._loop, name="scaletrain-mirror", daemon=True)
        self._thread.start()
        return self

    def close(self) -> str | None:
        """Stop the thread and upload what is left; what went wrong, if the last upload failed (said by the
        caller, never raised over the run's own outcome)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.sync()
        except Exception as e:  # noqa: BLE001 - each backend raises its own types; all are worded here
            return explain(e, self.store)
        return None
