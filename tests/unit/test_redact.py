import logging

from scaletrain.comm.profiles import check_names
from scaletrain.envvars import secret_values
from scaletrain.redact import MASK, RedactingFilter, Redactor


def test_env_secret_values_by_name():
    env = {"HF_TOKEN": "hf_abcdefghijklmnop", "OPENAI_API_KEY": "sk-123456", "DB_PASSWORD": "hunter22",
           "AWS_SECRET_ACCESS_KEY": "abcdefgh", "PATH": "/usr/bin:/bin", "SHORT_TOKEN": "abc"}
    vals = secret_values(env)
    assert set(vals) == {"hf_abcdefghijklmnop", "sk-123456", "hunter22", "abcdefgh"}


def test_redacts_values_urls_queries_and_assignments():
    r = Redactor(["sk-123456"])
    assert r("key is sk-123456.") == f"key is {MASK}."
    assert r("https://bob:tok3n@host/x.jsonl") == f"https://bob:{MASK}@host/x.jsonl"
    assert r("s3://b/x?token=abc&x=1") == f"s3://b/x?token={MASK}&x=1"
    assert r("HF_TOKEN=hf_zzzzzzzzzzzzzzzzzzzz") == f"HF_TOKEN={MASK}"
    assert r("{'WANDB_API_KEY': 'v'}") == f"{{'WANDB_API_KEY': '{MASK}'}}"
    assert r("token hf_AAAAAAAAAAAAAAAAAAAAAA in text") == f"token hf_{MASK} in text"
    assert r("nothing secret here: lr=0.1") == "nothing secret here: lr=0.1"
    metrics = '{"eval/tokens": 120, "throughput/tokens_per_s": 9.5, "secret_sauce": 1}'
    assert r(metrics) == metrics.replace('"secret_sauce": 1', '"secret_sauce": 1')
    assert r("AWS_SECRET_ACCESS_KEY=abc123 SECRET_KEY: xyz") == f"AWS_SECRET_ACCESS_KEY={MASK} SECRET_KEY: {MASK}"


def test_mapping_masks_secret_keys():
    out = Redactor().mapping({"comm": {"env": {"NCCL_DEBUG": "INFO", "WANDB_API_KEY": "x"}},
                              "data": {"train_file": "https://u:p4ss@h/d.jsonl"}})
    assert out["comm"]["env"] == {"NCCL_DEBUG": "INFO", "WANDB_API_KEY": MASK}
    assert out["data"]["train_file"] == f"https://u:{MASK}@h/d.jsonl"


def test_logging_filter(tmp_path):
    handler = logging.FileHandler(tmp_path / "l.log")
    handler.addFilter(RedactingFilter(Redactor(["s3cr3t-value"])))
    logger = logging.getLogger("t-redact")
    logger.addHandler(handler)
    logger.warning("using %s", "s3cr3t-value")
    try:
        raise ValueError("bad s3cr3t-value")
    except ValueError:
        logger.exception("failed")
    handler.close()
    text = (tmp_path / "l.log").read_text()
    assert "s3cr3t-value" not in text and MASK in text and "ValueError" in text


def test_misquoted_env_names():
    lines = check_names({"NCCL_TIMEOUT": "100", "RCCL_MIN_NRINGS": "8", "NCCL_DEBUG": "INFO"})
    assert len(lines) == 2
    assert "comm.timeout_s" in lines[0] and "NCCL_MIN_NCHANNELS" in lines[1]


# --- credentials by shape (issue: secrets are caught by their shape, not only their name) -------------------
import os  # noqa: E402
import stat  # noqa: E402

import pytest  # noqa: E402

from scaletrain.credentials import looks_like_secret, split_secrets  # noqa: E402

MUST_MASK = [  # (variable name, value, its secret part, what the redacted text keeps)
    ("AUTH_HEADER", "Bearer sk-live-0123456789abcdefXYZ", "0123456789abcdefXYZ", "Bearer ***"),
    ("NOTE", "token hf_AbCdEfGhIjKlMnOpQrStUv here", "AbCdEfGhIjKlMnOpQrStUv", "token hf_*** here"),
    ("OPENAI", "sk-proj-AbCdEf0123456789GhIjKl", "AbCdEf0123456789GhIjKl", "sk-***"),
    ("GH", "ghp_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6", "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6", "ghp_***"),
    ("GH", "github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "11ABCDEFG0123456789_abcdefghijklmnop",
     "github_pat_***"),
    ("AWS_ID", "AKIAIOSFODNN7EXAMPLE", "IOSFODNN7EXAMPLE", "AKIA***"),
    ("JWT", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
     "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "***"),
    ("DB_URL", "postgres://app:s3cr3t-pw@db:5432/x", "s3cr3t-pw", "postgres://app:***@db:5432/x"),
]
LOOK_ALIKES = [  # values that must stay readable, even in a variable whose name hints at a key
    ("GIT_KEY", "3f786850e387550fdab836ed7e6dc881de23001b"),  # a git sha
    ("RUN_KEY", "123e4567-e89b-12d3-a456-426614174000"),  # a UUID
    ("DATA_KEY", "/data/Team-A/Train_2024/v3/Sft-Mix.jsonl"),  # a path
    ("MODEL_KEY", "meta-llama/Meta-Llama-3-8B-Instruct"),  # a model id
    ("NCCL_SOCKET_IFNAME", "eth0"),
    ("TASK_NAME", "task-0123456789abcdefghij"),  # "sk-" inside a word is no key
]


@pytest.mark.parametrize("name,value,secret,kept", MUST_MASK)
def test_credential_shapes_are_masked_wherever_they_appear(name, value, secret, kept):
    assert looks_like_secret(name, value)
    text = Redactor()(f"in a log line: {value}.")  # free text: no name to go by
    assert secret not in text and kept in text


def test_random_keys_in_key_named_variables_are_secret_and_the_rest_is_not():
    assert looks_like_secret("SERVICE_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")  # an AWS secret key
    assert not looks_like_secret("DB_PASS", "x") and looks_like_secret("DB_PASS", "hunter22")
    for name, value in LOOK_ALIKES:
        assert not looks_like_secret(name, value), (name, value)
        assert Redactor()(f"{name}: {value}") == f"{name}: {value}"


def test_split_and_mapping_use_the_shape_as_well_as_the_name():
    env = {"AUTH_HEADER": "Bearer sk-live-0123456789abcdefXYZ", "WANDB_API_KEY": "w" * 12, "NCCL_DEBUG": "INFO"}
    public, secret = split_secrets(env)
    assert public == {"NCCL_DEBUG": "INFO"} and set(secret) == {"AUTH_HEADER", "WANDB_API_KEY"}
    out = Redactor().mapping({"comm": {"env": env}})["comm"]["env"]
    assert out == {"AUTH_HEADER": "Bearer ***", "WANDB_API_KEY": MASK, "NCCL_DEBUG": "INFO"}
    assert Redactor.from_environment(env)("header Bearer sk-live-0123456789abcdefXYZ") == "header ***"


def test_private_env_file_is_0600_read_by_the_worker_and_removed(tmp_path, monkeypatch):
    from scaletrain.comm.launch_env import load_private_env, private_env
    from scaletrain.envvars import SCALETRAIN_PRIVATE_ENV_FILE

    env = {"AUTH_HEADER": "Bearer sk-live-0123456789abcdefXYZ", "NCCL_DEBUG": "INFO"}
    with private_env(env, str(tmp_path)) as public:
        path = tmp_path / ".private-env.json"
        assert public == {"NCCL_DEBUG": "INFO", SCALETRAIN_PRIVATE_ENV_FILE: str(path)}
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        monkeypatch.setenv(SCALETRAIN_PRIVATE_ENV_FILE, str(path))
        monkeypatch.delenv("AUTH_HEADER", raising=False)
        load_private_env()
        assert os.environ["AUTH_HEADER"] == env["AUTH_HEADER"]
    assert not path.exists()
    with pytest.raises(RuntimeError), private_env(env, str(tmp_path)):
        raise RuntimeError("a failed fit")
    assert not path.exists()  # removed however the block ends
    with private_env({"NCCL_DEBUG": "INFO"}, str(tmp_path)) as public:  # nothing secret: no file, no variable
        assert public == {"NCCL_DEBUG": "INFO"} and not path.exists()


def test_the_override_warning_names_secrets_without_their_values():
    from scaletrain.envvars import worker_env

    with pytest.warns(UserWarning) as caught:
        worker_env({"WANDB_API_KEY": "config-secret-123456"}, {"WANDB_API_KEY": "shell-secret-654321"})
    text = str(caught[0].message)
    assert "WANDB_API_KEY: comm.env sets another value than your shell" in text
    assert "config-secret" not in text and "shell-secret" not in text


def test_doctor_warns_about_a_credential_written_in_the_config(tmp_path):
    from scaletrain.config import validate
    from scaletrain.config.load import literal_secrets
    from scaletrain.launch.doctor import Facts, Status, check_literal_secrets

    path = tmp_path / "c.yaml"
    path.write_text("model: {name_or_path: builtin:tiny-bert}\ndata: {train_file: x.jsonl}\n"
                    "comm:\n  env:\n    WANDB_API_KEY: ${WANDB_API_KEY}\n    AUTH_HEADER: Bearer "
                    "sk-live-0123456789abcdefXYZ\n"
                    "    NCCL_DEBUG: INFO\n")
    assert literal_secrets(path) == ["comm.env.AUTH_HEADER"]  # the ${VAR} reference is the right way
    facts = Facts(environ={}, vendor="cpu", gpu_count=0, shm_bytes=None, nofile_soft=None, disk_free_bytes=None,
                  port_free=True, config=validate({"model": {"name_or_path": "builtin:tiny-bert"},
                                                   "data": {"train_file": "x.jsonl"}}),
                  literal_secrets=literal_secrets(path))
    result = check_literal_secrets(facts)
    assert result.status is Status.WARN and "comm.env.AUTH_HEADER" in result.detail
    assert "${AUTH_HEADER}" in result.fix and "sk-live" not in result.detail + result.fix
