"""Ray's token authentication as scaletrain meets it: where the token is found (Ray's own order), what each answer
of a cluster leads to (one line, or a driver set up before ray is imported), and that the token is masked
wherever it was found. The real head is in tests/integration/test_token_cluster.py."""

import pytest

from scaletrain import envvars
from scaletrain.errors import LaunchError
from scaletrain.launch.cluster_auth import Answer, authenticate
from scaletrain.redact import Redactor

TOKEN = "0f1e2d3c4b5a69788796a5b4c3d2e1f0" * 2


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No Ray variables, and a home of the test's own (Ray's default token file lies there)."""
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_the_token_is_found_where_ray_looks_in_rays_order(clean, monkeypatch):
    assert envvars.ray_auth_token() is None
    (clean / ".ray").mkdir()
    (clean / ".ray" / "auth_token").write_text(f"{TOKEN}\n")  # as `ray get-auth-token --generate` leaves it
    assert envvars.ray_auth_token() == (TOKEN, "~/.ray/auth_token")
    named = clean / "elsewhere"
    named.write_text("  other-token \n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(named))
    assert envvars.ray_auth_token() == ("other-token", f"RAY_AUTH_TOKEN_PATH={named}")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-the-env")
    assert envvars.ray_auth_token() == ("from-the-env", "RAY_AUTH_TOKEN")
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(clean / "missing"))  # named but absent: no silent fallback
    assert envvars.ray_auth_token() == ("", f"RAY_AUTH_TOKEN_PATH={clean / 'missing'}")


def test_a_token_on_file_is_masked_by_every_redactor(clean):
    (clean / ".ray").mkdir()
    (clean / ".ray" / "auth_token").write_text(TOKEN)
    assert Redactor.from_environment()(f"ray said {TOKEN}.") == "ray said ***."


def _cluster(requires: bool, accepts: str | None = None):
    """A cluster's answers: open, or requiring a token (and accepting ``accepts``)."""
    def ask(token):
        if not requires or (token is not None and token == accepts):
            return Answer("ok")
        return Answer("unauthenticated")
    return ask


def test_an_open_cluster_needs_nothing_and_ours_on_is_said(clean, monkeypatch):
    assert authenticate("scaling.address=h:1", _cluster(False)) == ""
    assert "RAY_AUTH_MODE" not in envvars.snapshot()
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    note = authenticate("scaling.address=h:1", _cluster(False))
    assert "has token authentication off" in note and "RAY_AUTH_MODE=token here is not needed" in note


def test_a_token_cluster_gets_the_token_mode_set_before_ray(clean, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("RAY_AUTH_MODE", "unset")
    monkeypatch.delenv("RAY_AUTH_MODE")  # restored by monkeypatch after authenticate sets it
    asked = []
    assert authenticate("scaling.address=h:1", lambda t: asked.append(t) or _cluster(True, TOKEN)(t)) == ""
    assert asked == [None, TOKEN] and envvars.read("RAY_AUTH_MODE") == "token"


@pytest.mark.parametrize("setup, says", [
    ({}, "no token was found here; Ray looks in RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names, or "
         "~/.ray/auth_token; copy the head's token there (ray get-auth-token on the head node prints it)"),
    ({"RAY_AUTH_TOKEN": "a-token-of-another-cluster"}, "the cluster refused the token from RAY_AUTH_TOKEN"),
    ({"RAY_AUTH_TOKEN_PATH": "/nonexistent/token"}, "(RAY_AUTH_TOKEN_PATH=/nonexistent/token is empty or unreadable)"),
    ({"RAY_AUTH_TOKEN": TOKEN, "RAY_AUTH_MODE": "disabled"}, "RAY_AUTH_MODE=disabled here; unset RAY_AUTH_MODE"),
])
def test_what_cannot_authenticate_is_one_line(clean, monkeypatch, setup, says):
    for k, v in setup.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(LaunchError) as e:
        authenticate("scaling.address=h:1", _cluster(True, TOKEN))
    assert says in str(e.value) and "\n" not in str(e.value)
    assert "a-token-of-another-cluster" not in str(e.value)


def test_something_that_is_not_ray_is_named_with_the_port_to_give(clean):
    with pytest.raises(LaunchError, match="not a Ray cluster .HTTP 404.; give the head node's dashboard address"):
        authenticate("--address http://h:1", lambda t: Answer("not-ray", "HTTP 404"), "dashboard")
