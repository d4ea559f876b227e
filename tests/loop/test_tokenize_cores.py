"""Tokenization spread over the driver's cores (#46 item 2): a source of PARALLEL_ROWS records or more is tokenized
by a process per core unless data.preprocessing_num_workers says otherwise, into the same examples as one process,
and the note says records/s and per core."""

import json
import os

import pytest

from scaletrain.config import validate
from scaletrain.data import prepare_data
from scaletrain.data.spread import PARALLEL_ROWS, tokenize_processes
from scaletrain.model.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow


def test_a_large_source_is_tokenized_on_every_core_into_the_same_examples(tmp_path):
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: nothing to spread over")
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(json.dumps({"instruction": f"Count to {i % 9 + 1}.", "input": "",
                                          "output": " ".join(str(k) for k in range(i % 9 + 1))})
                              for i in range(PARALLEL_ROWS)))
    tok = load_tokenizer("builtin:tiny-llama")

    def prepared(workers):
        cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                        "data": {"train_file": str(path), "template": "alpaca", "max_length": 64, "eval_ratio": 0.01,
                                 "preprocessing_num_workers": workers, "cache_dir": str(tmp_path / f"c{workers}")},
                        "output": {"output_dir": str(tmp_path / "runs")}})
        return prepare_data(cfg, tok)

    spread, one = prepared(None), prepared(1)
    assert tokenize_processes(None, PARALLEL_ROWS) == cores
    said = next(n for n in spread.notes if n.startswith("data: tokenized"))
    assert f"with {cores} process(es)" in said and "per core" in said, said
    assert "with 1 process(es)" in next(n for n in one.notes if n.startswith("data: tokenized"))
    assert spread.train["input_ids"][:] == one.train["input_ids"][:]
    assert spread.train["labels"][:] == one.train["labels"][:] and len(spread.eval) == len(one.eval) == 200
