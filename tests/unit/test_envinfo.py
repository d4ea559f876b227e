"""`scaletrain env`: the facts a bug report needs in one pasteable block, secrets redacted (in this process, as
tests/cli.py runs a command; test_without_ray.py runs it once where Ray cannot be imported)."""

from tests.cli import run_cli

SECRET = "hf_EnvInfoSecretAbcdefghijklmn"


def test_env_prints_the_facts_a_bug_report_needs_and_no_secret(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", SECRET)  # a secret in a variable the block prints
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    out = run_cli("env")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "scaletrain env (paste this into a bug report)"
    for line in ("- torch build: CPU only", "- NCCL/RCCL: n/a (no GPU or not built with it)", "    NCCL_DEBUG=INFO",
                 "    none (torch sees no GPU)", "    CUDA_VISIBLE_DEVICES=(unset)"):
        assert line in lines, line
    assert any(ln.startswith("- torch: 2.") for ln in lines) and "gloo" in out.stdout
    assert "    NCCL_SOCKET_IFNAME=***" in lines and SECRET not in out.stdout + out.stderr
