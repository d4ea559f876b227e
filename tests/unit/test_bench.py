"""nccl-tests formulas against hand computations and recorded nccl-tests/rccl-tests outputs."""

import pytest

from scaletrain.comm.bench import (
    BenchParams,
    Row,
    average_busbw,
    bandwidths,
    bus_factor,
    format_table,
    format_time,
    parse_nccl_tests,
    parse_size,
    size_range,
    validate_params,
)
from scaletrain.commands.commbench import parse_sweep, rank_sweep
from scaletrain.errors import ConfigError
from tests.conftest import reference_file


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_bus_factors_by_hand():
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)  # 2 * 7 / 8
    assert bus_factor("all_reduce", 2) == pytest.approx(1.0)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("reduce_scatter", 16) == pytest.approx(15 / 16)
    assert bus_factor("all_to_all", 2) == pytest.approx(0.5)
    assert bus_factor("broadcast", 8) == 1.0
    with pytest.raises(ConfigError, match="unknown collective 'allreduce'"):
        bus_factor("allreduce", 2)


def test_bandwidths_by_hand():
    # 1 GiB all_reduce on 8 ranks in 10 ms: algbw = 1073741824 B / 0.01 s = 107.374 GB/s, busbw x 1.75
    alg, bus = bandwidths("all_reduce", 1024**3, 10_000.0, 8)
    assert alg == pytest.approx(107.3741824) and bus == pytest.approx(107.3741824 * 1.75)


@pytest.mark.parametrize("name,ranks", [("rccl-tests-all_reduce_perf-8xMI300X.txt", 8),
                                        ("rccl-tests-all_reduce_perf-2node-16xMI300X.txt", 16),
                                        ("nccl-tests-all_reduce_perf-2node-16xH100.txt", 16),
                                        ("nccl-tests-all_reduce_perf-2xRTX2080Ti.txt", 2)])
def test_formulas_reproduce_recorded_nccl_tests(name, ranks):
    path = reference_file(name)
    rows = parse_nccl_tests(path.read_text())
    assert len(rows) > 20
    for r in rows:
        if r["time_us"] < 100:  # below that the printed time has too few digits to recompute algbw
            continue
        alg, bus = bandwidths("all_reduce", r["size"], r["time_us"], ranks)
        assert alg == pytest.approx(r["algbw"], rel=0.01, abs=0.01)
        assert bus == pytest.approx(r["busbw"], rel=0.01, abs=0.01)


def test_sizes():
    assert parse_size("8") == 8 and parse_size("64K") == 65536 and parse_size("128M") == 128 * 1024**2
    assert parse_size("1G") == 1024**3 and parse_size("1.5K") == 1536
    assert size_range("8", "64", 2) == [8, 16, 32, 64]
    with pytest.raises(ConfigError, match="-b 12Q: not a size"):
        parse_size("12Q")
    with pytest.raises(ConfigError, match="-b 1M is larger than -e 1K; swap them"):
        size_range("1M", "1K", 2)
    with pytest.raises(ConfigError, match="-f 1"):
        size_range("8", "64", 1)


def test_one_worker_is_rejected():
    with pytest.raises(ConfigError, match="at least 2 workers"):
        validate_params(BenchParams(), 1)


def test_time_format_and_table_columns():
    assert format_time(19.281) == "  19.28" and format_time(149.93) == "  149.9" and format_time(12646.4) == "  12646"
    row = Row("all_reduce", 1048576, 262144, "float", "sum", -1, 28.39, 36.94, 64.64, 0, 28.04, 37.40, 65.45, 0)
    table = format_table([row])
    assert "#       size         count      type   redop    root     time   algbw   busbw #wrong" in table
    line = [ln for ln in table.splitlines() if ln.strip().startswith("1048576")][0]
    assert line.split() == ["1048576", "262144", "float", "sum", "-1", "28.39", "36.94", "64.64", "0",
                            "28.04", "37.40", "65.45", "0"]
    assert f"# Avg bus bandwidth    : {average_busbw([row]):.3f}" in table and "OK" in table


def test_sweep_parsing_and_ranking():
    combos = parse_sweep(["NCCL_ALGO=Ring,Tree", "NCCL_MIN_NCHANNELS=8,16"])
    assert len(combos) == 4 and {"NCCL_ALGO": "Tree", "NCCL_MIN_NCHANNELS": "16"} in combos
    with pytest.raises(ConfigError, match="value list is empty"):
        parse_sweep(["NCCL_ALGO="])
    rows = lambda bw: [{"size": 16 * 2**20, "oop_busbw": bw, "ip_busbw": bw},
                       {"size": 8, "oop_busbw": 99, "ip_busbw": 99}]
    ranked = rank_sweep([({"A": "1"}, rows(10.0)), ({"A": "2"}, rows(20.0))], 25 * 2**20)
    assert ranked[0] == ({"A": "2"}, 20.0)  # the 8-byte row (busbw 99) is outside the bucket window


def test_a_missing_reference_file_skips_with_its_path_or_fails_where_ci_requires_it(monkeypatch):
    from tests.conftest import REQUIRE_REFERENCE

    monkeypatch.delenv(REQUIRE_REFERENCE, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no-such-output.txt not present"):
        reference_file("no-such-output.txt")
    monkeypatch.setenv(REQUIRE_REFERENCE, "1")
    with pytest.raises(pytest.fail.Exception, match="CI must run the tests that read it"):
        reference_file("no-such-output.txt")
