"""Placement feasibility and cluster-address probing, without a cluster."""

import os
import socket

import pytest

from scaletrain.envvars import LOCAL_RAY_DEFAULTS
from scaletrain.envvars import RAY_TRAIN_ENABLE_PREEMPTION_WATCHER as WATCHER
from scaletrain.errors import LaunchError
from scaletrain.launch.cluster_auth import Answer
from scaletrain.launch.plan import check_placement
from scaletrain.launch.ray_launcher import _probe_address

TWO_NODES = [{"CPU": 1.0}, {"CPU": 1.0}]


def test_strict_spread_needs_a_node_per_worker():
    check_placement("STRICT_SPREAD", 2, {"CPU": 1}, TWO_NODES)
    with pytest.raises(LaunchError, match=r"STRICT_SPREAD puts each of the 3 workers on its own node, but only 2 of "
                                          r"the cluster's 2 node\(s\) have 1 CPU free"):
        check_placement("STRICT_SPREAD", 3, {"CPU": 1}, TWO_NODES)


def test_strict_pack_needs_one_big_node():
    check_placement("STRICT_PACK", 2, {"CPU": 1}, [{"CPU": 4.0}])
    with pytest.raises(LaunchError, match=r"no node has 2 CPU .*the largest has 1 CPU"):
        check_placement("STRICT_PACK", 2, {"CPU": 1}, TWO_NODES)
    check_placement("PACK", 2, {"CPU": 1}, TWO_NODES)  # PACK/SPREAD may split


def test_unreachable_address_fails_fast():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connection refused
        with pytest.raises(LaunchError, match=rf"nothing answers at 127.0.0.1:{port}.*ray start --head --port={port}"):
            _probe_address(f"127.0.0.1:{port}", timeout_s=2)
    with pytest.raises(LaunchError, match="write host:port"):
        _probe_address("not-an-address")
    _probe_address("auto")  # left to Ray


@pytest.fixture
def fake_ray(monkeypatch):
    import logging

    import ray
    from ray._private.authentication import authentication_token_setup as auth

    from scaletrain.launch.ray_launcher import RAY_AUTH_NOTICE_LOGGER

    class Calls(list):  # ray.init's keyword arguments per call, and the auth notices logged
        notices: list[str]

    calls = Calls()

    def init(**kw):
        auth._warn_token_auth_enabled()  # what Ray's init logs when it starts a new local cluster
        calls.append(kw)

    notices = []
    handler = logging.Handler()
    handler.emit = lambda record: notices.append(record.getMessage())
    notice_logger = logging.getLogger(RAY_AUTH_NOTICE_LOGGER)
    level = notice_logger.level
    notice_logger.addHandler(handler)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr("scaletrain.launch.ray_launcher._probe_address", lambda address: None)
    # no traffic to the fake cluster's address: its GCS "answers" without token authentication
    monkeypatch.setattr("scaletrain.launch.cluster_auth.ask_gcs", lambda address, token=None: Answer("ok"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # setenv first so the teardown restores the variable ensure_ray sets (delenv of an unset name records nothing)
    for name in LOCAL_RAY_DEFAULTS:
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    calls.notices = notices
    yield calls
    notice_logger.removeHandler(handler)
    notice_logger.setLevel(level)


def test_embedded_ray_drops_the_preemption_watcher_unless_the_user_set_it(fake_ray, monkeypatch):
    from scaletrain.launch.ray_launcher import ensure_ray

    assert ensure_ray(None) is True
    assert os.environ[WATCHER] == "0"
    # nothing scrapes an embedded Ray's metrics: its processes neither collect them nor keep event-loop statistics
    assert os.environ["RAY_enable_metrics_collection"] == "0" and os.environ["RAY_event_stats"] == "0"
    assert "address" not in fake_ray[0]
    assert fake_ray.notices == []  # Ray's token-authentication notice is not in every run's output

    monkeypatch.setenv(WATCHER, "1")
    ensure_ray(None)
    assert os.environ[WATCHER] == "1"


def test_a_cluster_keeps_the_preemption_watcher(fake_ray, monkeypatch):
    from scaletrain.launch.ray_launcher import ensure_ray

    assert ensure_ray("10.0.0.1:6379") is False
    assert fake_ray[0]["address"] == "10.0.0.1:6379"
    assert not any(name in os.environ for name in LOCAL_RAY_DEFAULTS)  # a cluster's metrics may be scraped
    assert [n.split(".")[0] for n in fake_ray.notices] == ["Token authentication is enabled for this Ray cluster"]
