"""Object-store locations (``s3://``, ``gs://``, ``abfs://``; MinIO and Ceph as S3 with an endpoint) through
fsspec, and the write probe that answers in seconds before any worker starts.

A ``Store`` is a run directory's home on object storage: its URI and the endpoint of an S3-compatible server.
Credentials are never part of it: the backends read the standard chain (AWS_ACCESS_KEY_ID / ~/.aws / an instance
role; GOOGLE_APPLICATION_CREDENTIALS; AZURE_STORAGE_*), so nothing scaletrain writes can hold them.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

from scaletrain.errors import LaunchError

# scheme -> (the fsspec backend's package, scaletrain's extra that installs it)
BACKENDS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
            "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure"), "az": ("adlfs", "azure")}
# Connection attempts fail in seconds: a wrong endpoint must not become minutes of retries (botocore's config).
S3_CLIENT = {"connect_timeout": 5, "read_timeout": 120, "retries": {"max_attempts": 3, "mode": "standard"}}


def is_uri(path: str | os.PathLike | None) -> bool:
    return path is not None and "://" in str(path) and not str(path).startswith("file://")


@dataclass(frozen=True)
class Store:
    """``uri``: scheme://bucket/prefix (no trailing slash)."""

    uri: str
    endpoint_url: str | None = None

    @classmethod
    def of(cls, uri: str, endpoint_url: str | None = None) -> Store:
        scheme = uri.split("://", 1)[0].lower()
        if scheme not in BACKENDS:
            raise LaunchError(f"{uri}: unknown storage scheme {scheme}://; use a local path or one of "
                              f"s3://, gs://, abfs:// (MinIO and Ceph: s3:// with storage.endpoint_url)")
        bucket = uri.split("://", 1)[1].strip("/")
        if not bucket:
            raise LaunchError(f"{uri}: no bucket; write {scheme}://BUCKET/PREFIX")
        return cls(f"{scheme}://{bucket}", endpoint_url)

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]

    @property
    def name(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    def child(self, *parts: str) -> Store:
        return Store("/".join([self.uri, *(p.strip("/") for p in parts if p)]), self.endpoint_url)

    @property
    def path(self) -> str:
        """The filesystem's path (the URI without its scheme)."""
        return self.uri.split("://", 1)[1]

    def options(self) -> dict:
        """fsspec storage options (also DCP's FsspecWriter/Reader keyword arguments)."""
        if self.scheme in ("s3", "s3a"):
            opts: dict = {"config_kwargs": S3_CLIENT}
            if self.endpoint_url:
                opts["endpoint_url"] = self.endpoint_url
            return opts
        return {}

    @property
    def fs(self):
        return filesystem(self.scheme, self.endpoint_url)

    def __str__(self) -> str:
        return self.uri


@functools.lru_cache(maxsize=8)
def filesystem(scheme: str, endpoint_url: str | None):
    package, extra = BACKENDS[scheme]
    try:
        import fsspec

        return fsspec.filesystem(scheme, **Store(f"{scheme}://x", endpoint_url).options())
    except ImportError:
        raise LaunchError(f"{scheme}:// needs {package}, which is not installed: pip install 'scaletrain[{extra}]'"
                          ) from None


def probe(store: Store, key: str = "output.output_dir") -> float:
    """Write and delete one small object under ``store`` (the run directory's parent): every way that can fail
    (nothing listens at the endpoint, no such bucket, no or wrong credentials, no write permission) is one line
    naming ``key`` and the fix, in seconds. Returns the round trip in seconds."""
    fs = store.fs
    target = f"{store.path}/.scaletrain-write-probe-{os.getpid()}-{time.time_ns()}"
    started = time.perf_counter()
    try:
        fs.pipe_file(target, b"scaletrain")
        fs.rm_file(target)
    except Exception as e:  # noqa: BLE001 - each backend raises its own types; all are worded here
        raise LaunchError(f"{key}={store.uri}: {explain(e, store)}") from None
    return time.perf_counter() - started


def explain(e: BaseException, store: Store) -> str:
    """One line for a failed object-store call: what is wrong and the fix (the exception's own words kept)."""
    name, text = type(e).__name__, str(e).splitlines()[0] if str(e) else type(e).__name__
    bucket = store.path.split("/", 1)[0]
    endpoint = store.endpoint_url or "the default endpoint (AWS_ENDPOINT_URL or the cloud's)"
    lowered = f"{name} {text}".lower()
    if "nocredentials" in lowered or "unable to locate credentials" in lowered:
        return ("no credentials found; export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or set a profile in "
                "~/.aws/credentials, or run with an instance role)")
    if any(w in lowered for w in ("could not connect", "connect timeout", "cannot connect", "connection refused",
                                  "endpointconnection", "name or service not known")):
        return f"nothing answers at {endpoint} ({text}); start the server or fix storage.endpoint_url"
    if "bucket does not exist" in lowered or "nosuchbucket" in lowered:
        return f"the bucket {bucket} does not exist; create it (e.g. aws s3 mb s3://{bucket}) or fix the URI"
    if any(w in lowered for w in ("invalidaccesskeyid", "signaturedoesnotmatch", "invalid access key",
                                  "key id you provided does not exist", "signature we calculated does not match",
                                  "invalidtoken", "expiredtoken", "token included in the request is invalid")):
        return f"the credentials were refused ({text}); fix AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
    if isinstance(e, PermissionError) or "accessdenied" in lowered or "forbidden" in lowered:
        return f"no permission to write there ({text}); grant s3:PutObject and s3:DeleteObject on it or choose another"
    return f"cannot write there ({name}: {text}); check the URI, the endpoint and the credentials"


INPUTS = "~/.cache/scaletrain/inputs"


def local_input(path: str, key: str) -> str:
    """A data file given as a URI (``data.train_file: s3://bucket/train.jsonl``), as a local copy the driver
    prepares from (downloaded again when the object's size or checksum changed); a path is returned as it is.
    The endpoint and credentials are the standard chain's (AWS_ENDPOINT_URL for MinIO). The workers never read
    it: they get the tokenized splits."""
    if not is_uri(path):
        return path
    import hashlib
    import json
    from pathlib import Path

    from scaletrain.errors import DataError

    store = Store.of(path)
    try:
        info = store.fs.info(store.path)
    except FileNotFoundError:
        raise DataError(f"{key}={path}: no such object; check the URI") from None
    except Exception as e:  # noqa: BLE001 - each backend raises its own types; all are worded here
        raise DataError(f"{key}={path}: {explain(e, store)}") from None
    stamp = json.dumps([info.get("size"), str(info.get("ETag") or info.get("md5Hash") or info.get("mtime"))])
    folder = Path(INPUTS).expanduser() / hashlib.sha256(path.encode()).hexdigest()[:16]
    local, seen = folder / store.name, folder / ".stamp"
    if not (local.is_file() and seen.is_file() and seen.read_text() == stamp):
        folder.mkdir(parents=True, exist_ok=True)
        store.fs.get_file(store.path, str(local))
        seen.write_text(stamp)
    return str(local)
