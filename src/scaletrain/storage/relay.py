"""Workers that never need the driver's disk: their run-directory files travel to the driver through Ray.

When a run lives on object storage, a worker has no view of the driver's mirror. Each worker writes its files
(heartbeat, log, stack dumps, rank 0's metrics, events, timeline and summary) where it always does, in a run
directory of its own on its node (``<storage.node_dir>/.../rank-<R>``), and a ``Forwarder`` thread sends what
is new in it, about every second, to the ``Relay``: a Ray actor on the driver's node that writes it into the
mirror. The driver's hang detection, monitor, alerts, report and ``watch`` read the mirror as they read a local
run directory. The answer to every send says whether the driver asked the run to stop (its STOP file), which the
forwarder mirrors locally, where the step check looks. Checkpoints and the final model go to the store directly
(never through here); the tokenized data comes from the store, once per node.

Written here rather than with Ray's log streaming: the driver needs the files themselves, byte for byte, at the
paths its readers know, and a worker's last lines before an exception (the flush in ``close``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

from scaletrain.rundir import RunDir
from scaletrain.storage.uri import Store

log = logging.getLogger("scaletrain.storage")

APPENDED = (".jsonl", ".log")  # sent as their new complete lines; every other file whole, when it changes


class Relay:
    """The driver's end (a Ray actor on its node): writes what workers send into the mirror."""

    def __init__(self, mirror: str):
        self.mirror = Path(mirror).resolve()

    def push(self, items: list[tuple[str, str, bytes]]) -> bool:
        """``items``: (path relative to the run directory, "a" to append or "w" to replace, bytes). Returns
        whether the run was asked to stop."""
        for rel, mode, data in items:
            path = (self.mirror / rel).resolve()
            if not path.is_relative_to(self.mirror):  # a path that leaves the run directory is never written
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if mode == "a":
                with open(path, "ab") as f:
                    f.write(data)
            else:
                tmp = path.with_name(f".{path.name}.relay")
                tmp.write_bytes(data)
                os.replace(tmp, path)
        return RunDir(self.mirror).stop.exists()


def start_relay(mirror: Path):
    """The relay actor, on this (the driver's) node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    actor = ray.remote(num_cpus=0)(Relay).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False), max_concurrency=4)
    return actor.remote(str(mirror))


class Forwarder:
    """The worker's end: sends what is new under ``local`` to the relay every ``interval_s``."""

    def __init__(self, local: Path, push, interval_s: float = 1.0):
        """``push``: sends a list of items to the relay and returns its answer (``Relay.push``)."""
        self.local, self.push, self.interval_s = Path(local), push, interval_s
        # What an earlier process of this rank left here was sent by it (a restart starts after it).
        self.sent: dict[str, tuple[int, int, int]] = {rel: (st.st_size, st.st_mtime_ns, st.st_size)
                                                      for rel, st in self._files()}
        self.sends, self.busy_s, self.started = 0, 0.0, time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scaletrain-forwarder", daemon=True)

    def _files(self):
        for p in self.local.rglob("*"):
            rel = p.relative_to(self.local).as_posix()
            if rel.split("/", 1)[0] not in RunDir.NOT_FORWARDED and p.is_file() and not RunDir.is_partial(p.name):
                yield rel, p.stat()

    def pending(self, final: bool = False) -> tuple[list[tuple[str, str, bytes]], dict]:
        """What to send, and what will count as sent once the relay has it."""
        items, sent = [], {}
        for rel, st in self._files():
            size, mtime, offset = self.sent.get(rel, (-1, -1, 0))
            if (st.st_size, st.st_mtime_ns) == (size, mtime):
                continue
            path = self.local / rel
            if rel.endswith(APPENDED):
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read(st.st_size - offset)
                if not final:  # whole lines only: a line the worker is still writing waits for the next round
                    data = data[:data.rfind(b"\n") + 1]
                if data:
                    items.append((rel, "a", data))
                done = offset + len(data)  # all of it sent: unchanged until it grows; else look again next round
                sent[rel] = (st.st_size, st.st_mtime_ns, done) if done == st.st_size else (-1, -1, done)
            else:
                items.append((rel, "w", path.read_bytes()))
                sent[rel] = (st.st_size, st.st_mtime_ns, st.st_size)
        return items, sent

    def send(self, final: bool = False) -> None:
        t0 = time.perf_counter()
        items, sent = self.pending(final)
        stop = self.push(items)  # a failed send sends the same again next round: nothing is lost
        self.sent.update(sent)
        self.sends += 1
        self.busy_s += time.perf_counter() - t0
        if stop:
            RunDir(self.local).stop.touch()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.send()
            except Exception as e:  # noqa: BLE001 - the driver may be gone; the worker's own work goes on
                log.warning("could not send run files to the driver: %s", e)

    def start(self) -> Forwarder:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        wall = time.perf_counter() - self.started
        log.info("forwarder: %d sends to the driver, %.3f s spent sending (%.3f%% of %.0f s)", self.sends,
                 self.busy_s, 100 * self.busy_s / max(wall, 1e-9), wall)
        try:
            self.send(final=True)
        except Exception as e:  # noqa: BLE001 - as above
            log.warning("could not send the last run files to the driver: %s", e)


def node_dir(storage_cfg: dict, store: Store) -> Path:
    root = storage_cfg.get("node_dir") or os.path.join(tempfile.gettempdir(), "scaletrain")
    return (Path(root).expanduser() / store.scheme / store.path).resolve()


def download_tree(store: Store, dest: Path) -> None:
    """``store``'s objects into ``dest`` (created whole: downloaded beside it, then renamed into place, so that a
    worker killed midway leaves no half copy and the ranks of one node download it once)."""
    if dest.exists():
        return
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        fs = store.fs
        fs.invalidate_cache(store.path)
        for f in fs.find(store.path):
            target = tmp / f[len(store.path) + 1:]
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(f, str(target))
        try:
            os.rename(tmp, dest)
        except OSError:  # another rank of this node was first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def worker_view(spec, relay, rank: int) -> Iterator:
    """The spec this worker runs with when its run lives on object storage (``spec.store``): its own run
    directory on this node, the data downloaded from the store, and the forwarder running while it trains."""
    store = Store(spec.store, spec.config["storage"].get("endpoint_url"))
    node = node_dir(spec.config["storage"], store)
    local = node / f"rank-{rank}"
    local.mkdir(parents=True, exist_ok=True)
    RunDir(local).stop.unlink(missing_ok=True)  # a stop of an earlier session is done
    for split in dict.fromkeys(p for p in (spec.train_path, spec.eval_path) if p):  # data/train, data/eval only
        (node / split).parent.mkdir(parents=True, exist_ok=True)
        download_tree(store.child(split), node / split)
    import ray

    forwarder = Forwarder(local, lambda items: ray.get(relay.push.remote(items))).start()
    try:
        yield replace(spec, run_dir=str(local), train_path=str(node / spec.train_path) if spec.train_path else "",
                      eval_path=str(node / spec.eval_path))
    finally:
        forwarder.close()
