"""`scaletrain preview`: what it marks is exactly the labels the workers read (the data cache), and a chat dataset
where every token is a label (the assistant turns were not found) is refused before anything starts."""

import json

import pytest

from scaletrain.config import validate
from scaletrain.data import IGNORE_INDEX, prepare_data
from scaletrain.data.preview import CLOSE, OPEN, describe, marked
from scaletrain.errors import DataError
from scaletrain.model.tokenizer import load_tokenizer

ROWS = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Opposite of {w}?"},
                      {"role": "assistant", "content": f"Not {w}."}, {"role": "user", "content": "Sure?"},
                      {"role": "assistant", "content": "Yes."}]} for w in ("hot", "fast", "up", "big", "new", "old")]


def _cfg(tmp_path, **data):
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS))
    return validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                     "data": {"train_file": str(path), "formatting": "messages", "template": "chatml",
                              "max_length": 128, "eval_ratio": 0, **data},
                     "output": {"output_dir": str(tmp_path / "runs")}})


def test_the_preview_marks_the_labels_the_cache_holds(tmp_path):
    from scaletrain.commands.preview import examples

    tok = load_tokenizer("builtin:tiny-llama")
    cfg = _cfg(tmp_path)
    prepared = prepare_data(cfg, tok)  # as train does: the cache entry the workers read
    shown_tok, rows, where = examples(cfg, 2)
    assert where.startswith("the data cache ")
    for ex, cached in zip(rows, prepared.train):
        assert list(ex["labels"]) == list(cached["labels"])
        text = marked(tok, ex["input_ids"], ex["labels"])
        trained = [piece.split(CLOSE)[0] for piece in text.split(OPEN)[1:]]
        assert trained == [tok.decode(t) for t in _runs(cached["input_ids"], cached["labels"])]
        assert trained == ["Not " + cached_word(text) + ".<|im_end|>", "Yes.<|im_end|>"]
        assert "Be brief." not in "".join(trained) and "Sure?" not in "".join(trained)
    head = describe(tok, rows[0], 0).splitlines()[0]
    k = sum(1 for lab in rows[0]["labels"] if lab != IGNORE_INDEX)
    assert head == f"example 0: {len(rows[0]['labels'])} tokens, {k} trained ({100 * k / len(rows[0]['labels']):.1f}%)"


def cached_word(text: str) -> str:
    return text.split("Opposite of ")[1].split("?")[0]


def _runs(ids, labels):
    out, cur = [], []
    for t, lab in zip(ids, labels):
        if lab != IGNORE_INDEX:
            cur.append(t)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def test_without_a_cache_the_preview_tokenizes_only_what_it_shows(tmp_path):
    from scaletrain.commands.preview import examples

    cfg = _cfg(tmp_path)
    _, rows, where = examples(cfg, 1)
    assert len(rows) == 1 and where == "the first 2 records of each source (no data cache yet)"
    assert not (tmp_path / "runs").exists()  # nothing cached by a preview


def test_a_template_that_marks_every_token_is_refused(tmp_path):
    every = tmp_path / "every.jinja"  # generation marks around the whole conversation: prompts would train
    every.write_text("{% generation %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                     "{% endfor %}{% endgeneration %}")
    with pytest.raises(DataError, match="every token of the 6 training examples is a label, prompts included"):
        prepare_data(_cfg(tmp_path, template=str(every)), load_tokenizer("builtin:tiny-llama"))


def test_main_log_gets_a_first_example_of_token_data_only():
    import datasets

    from scaletrain.data.preview import first_example

    tok = load_tokenizer("builtin:tiny-llama")
    chat = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]], "labels": [[-100, 2, 3]]})
    assert first_example(tok, chat).startswith("example 0: 3 tokens, 2 trained (66.7%)")
    classes = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]], "labels": [1]})  # a class label per example
    assert first_example(tok, classes) is None
