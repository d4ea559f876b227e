"""The object-store backend of checkpoint/storage.py's ``Storage``: a checkpoint written in place by every rank,
committed by its manifest (there is no rename on S3, GCS or Azure)."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from scaletrain.checkpoint.storage import STEP_PREFIX


class ObjectStorage:
    """An object store under ``store`` (storage/uri.py). Its paths are ``Path("/" + bucket/key)``: the same
    joins and names as a local run directory's. There is no rename: a checkpoint is written where it stays, and
    it exists once its manifest does (``verify``); an upload killed midway leaves objects without a manifest,
    which ``resume_point`` passes over and the next save of that step removes. The manifest holds the store's
    own checksum of each object (its ETag) with its size: reading every shard back to hash it would download
    the whole checkpoint once more."""

    def __init__(self, store):
        self.store = store
        self.fs = store.fs

    @staticmethod
    def root_of(store) -> Path:
        """The namespace path of ``store``'s URI (what RunDir-style joins start from)."""
        return Path("/" + store.path)

    def _key(self, path: Path) -> str:
        return str(path).lstrip("/")

    def describe(self, path: Path) -> str:
        return f"{self.store.scheme}://{self._key(path)}"

    def staging(self, final: Path) -> Path:
        return final

    def fresh(self, path: Path) -> None:
        self.remove(path)  # a leftover of a killed save of this very step (it has no manifest, or we are past it)

    def commit(self, tmp: Path, final: Path) -> None:
        assert tmp == final  # written in place; the manifest (written before this) is the commit

    def remove(self, path: Path) -> None:
        key = self._key(path)
        self.fs.invalidate_cache(key)
        if self.fs.exists(key):
            self.fs.rm(key, recursive=True)
        self.fs.invalidate_cache(key)

    def checkpoints(self, root: Path) -> list[Path]:
        key = self._key(root)
        self.fs.invalidate_cache(key)
        try:
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(key, detail=False)]
        except FileNotFoundError:
            return []
        found = [root / n for n in names if n.startswith(STEP_PREFIX) and n[len(STEP_PREFIX):].isdigit()]
        return sorted(found, key=lambda p: int(p.name[len(STEP_PREFIX):]))

    def files(self, path: Path) -> list[str]:
        key = self._key(path)
        self.fs.invalidate_cache(key)
        return sorted(f[len(key) + 1:] for f in self.fs.find(key))

    def sha256(self, path: Path) -> str | None:
        key = self._key(path)
        try:
            info = self.fs.info(key)
        except FileNotFoundError:
            return None
        tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("content_settings", "")
        return f"{str(tag).strip(chr(34))}:{info.get('size')}"

    def read_text(self, path: Path) -> str | None:
        try:
            return self.fs.cat_file(self._key(path)).decode()
        except FileNotFoundError:
            return None

    def write_text(self, path: Path, text: str) -> None:
        self.fs.pipe_file(self._key(path), text.encode())

    def save_torch(self, obj, path: Path) -> None:
        buf = io.BytesIO()
        torch.save(obj, buf)
        self.fs.pipe_file(self._key(path), buf.getvalue())

    def load_torch(self, path: Path):
        try:
            data = self.fs.cat_file(self._key(path))
        except FileNotFoundError:
            return None
        return torch.load(io.BytesIO(data), weights_only=False)

    def free_bytes(self, path: Path) -> None:
        return None

    def dcp_writer(self, path: Path):
        # DCP's fsspec writer (torch 2.13 does not re-export it from torch.distributed.checkpoint, hence the
        # module path): each rank writes its own shard file straight to the store.
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(self.describe(path), **self.store.options())

    def dcp_reader(self, path: Path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(self.describe(path), **self.store.options())
