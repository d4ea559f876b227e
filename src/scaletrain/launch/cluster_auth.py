"""Ray's token authentication, as a cluster asks for it (Ray >= 2.52; KubeRay's authOptions, `ray start` with a
token on file or RAY_AUTH_MODE=token).

Before ``ray`` is imported, the cluster is asked whether it requires a token (one unauthenticated call: the GCS
answers ``UNAUTHENTICATED``, the dashboard 401); if it does, the token is found where Ray's own clients find it
(``envvars.ray_auth_token``), tried once (refused: one line, no minutes of retries), and the driver's
``RAY_AUTH_MODE=token`` is set so that Ray sends it. The token itself is never printed, logged or written: only
where it was found is named, and ``envvars.secret_values`` makes every redactor mask it.

Written here rather than left to ``ray.init``: Ray's own failure is three ``InvalidAuthToken`` log lines and then
"cannot connect", or a multi-line ``AuthenticationError`` from the Job API, neither naming the token's places.
"""

from __future__ import annotations

import http.client
import json
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass

from scaletrain import envvars
from scaletrain.errors import LaunchError

PROBE_TIMEOUT_S = 5.0
WHERE_RAY_LOOKS = (f"{envvars.RAY_AUTH_TOKEN}, the file {envvars.RAY_AUTH_TOKEN_PATH} names, or "
                   f"{envvars.RAY_DEFAULT_TOKEN_FILE}")
# A GCS call every Ray version has, that takes an empty request (GcsService: GetClusterId).
GCS_PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"


@dataclass(frozen=True)
class Answer:
    """What a cluster said to a call: ``ok``, ``unauthenticated`` (no token, or a refused one), or ``not-ray``
    with the detail (something else answers there)."""

    kind: str
    detail: str = ""


def _bearer(token: str | None) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")] if token else []


def ask_gcs(address: str, token: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> Answer:
    """One call to the GCS at ``host:port`` (with ``token`` when given)."""
    import grpc

    channel = grpc.insecure_channel(address)
    try:
        channel.unary_unary(GCS_PROBE_METHOD)(b"", timeout=timeout_s, metadata=_bearer(token) or None)
        return Answer("ok")
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNAUTHENTICATED:
            return Answer("unauthenticated")
        return Answer("not-ray", f"{e.code().name}: {(e.details() or '').splitlines()[0][:160]}")
    finally:
        channel.close()


def ask_dashboard(url: str, token: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> Answer:
    """One ``GET /api/version`` of the dashboard at ``url`` (the Job Submission API lives there)."""
    request = urllib.request.Request(url.rstrip("/") + "/api/version", headers=dict(
        (k.title(), v) for k, v in _bearer(token)))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            body = r.read(4096)
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            return Answer("unauthenticated")
        return Answer("not-ray", f"HTTP {e.code}")
    except (http.client.HTTPException, urllib.error.URLError, OSError) as e:  # e.g. the GCS's HTTP/2 port
        return Answer("not-ray", f"{type(e).__name__}: not an HTTP server")
    try:
        ok = "ray_version" in json.loads(body)
    except (ValueError, TypeError):
        ok = False
    return Answer("ok") if ok else Answer("not-ray", "its /api/version is not Ray's")


NOT_RAY_HINT = {"gcs": "give the head node's GCS address (host:6379 by default; ray status on the head prints it), "
                       "not its dashboard's",
                "dashboard": "give the head node's dashboard address (http://host:8265 by default), not its GCS "
                             "port"}


def authenticate(what: str, ask, kind: str = "gcs") -> str:
    """Make this driver able to talk to the cluster ``ask`` reaches (``ask(token) -> Answer``); ``what`` names the
    setting in errors (``scaling.address=h:p``), ``kind`` what is asked ("gcs" or "dashboard"). Returns a note for
    the console, or "" (nothing to say).

    Raises LaunchError, in one line: something that is not Ray answers; the cluster requires a token and none is
    found, or the one found is refused; RAY_AUTH_MODE=disabled here but the cluster requires a token."""
    first = ask(None)
    if first.kind == "not-ray":
        raise LaunchError(f"{what}: something answers there but it is not a Ray cluster ({first.detail}); "
                          f"{NOT_RAY_HINT[kind]}")
    mode = (envvars.read(envvars.RAY_AUTH_MODE) or "").lower()
    if first.kind == "ok":
        if mode == "token":  # the cluster ignores the token Ray will send: it works, and is worth a word
            return (f"{what}: the cluster has token authentication off (anyone who reaches it can run code there); "
                    f"RAY_AUTH_MODE=token here is not needed")
        return ""
    if mode == "disabled":
        raise LaunchError(f"{what}: the cluster requires Ray's token authentication but RAY_AUTH_MODE=disabled "
                          f"here; unset RAY_AUTH_MODE (scaletrain then sends the token from {WHERE_RAY_LOOKS})")
    found = envvars.ray_auth_token()
    if found is None or not found[0]:
        where = f" ({found[1]} is empty or unreadable)" if found else ""
        raise LaunchError(f"{what}: the cluster requires Ray's token authentication and no token was found here"
                          f"{where}; Ray looks in {WHERE_RAY_LOOKS}; copy the head's token there (ray get-auth-token "
                          f"on the head node prints it)")
    token, where = found
    if ask(token).kind != "ok":
        raise LaunchError(f"{what}: the cluster refused the token from {where} (a token of another cluster?); "
                          f"copy the head's token there (ray get-auth-token on the head node prints it)")
    envvars.apply_defaults(envvars.TOKEN_DRIVER_DEFAULTS)
    if "ray" in sys.modules:  # imported already (scale, a notebook): Ray re-reads its mode as its own setup does
        from ray._raylet import Config

        Config.initialize("")
    return ""


def gcs_address(address: str) -> str | None:
    """The ``host:port`` of a GCS address to ask, or None where there is none to ask (``auto``, Ray Client's
    ``ray://``: its server authenticates the same way, and ray.init names it)."""
    if address == "auto" or address.startswith("ray://"):
        return None
    return address.split("://", 1)[-1].rstrip("/")
