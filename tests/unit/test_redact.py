import logging

from scaletrain.comm.env import secret_values
from scaletrain.comm.profiles import check_names
from scaletrain.redact import MASK, Redactor, RedactingFilter


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
