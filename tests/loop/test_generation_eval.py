"""`scaletrain eval RUN_DIR --data FILE`: each held-out record's last reply generated greedily through the template
the run trained with and scored as LLaMA-Factory's predict_with_generate reports it (BLEU-4 over characters,
ROUGE-1/2/L over jieba words, x 100, averaged); the predictions kept in the run (never overwritten) and shown by
its report and by `report A B`. A tiny LoRA run saved in bf16, in this process."""

import json

import pytest

from scaletrain.after.gen_eval import METRICS, similarity
from scaletrain.cli import main
from scaletrain.data.templates import BUILTIN_TEMPLATES
from tests.conftest import lora_run_dir

pytestmark = pytest.mark.loop

ROWS = [{"instruction": f"Count to {n}.", "input": "", "output": " ".join(str(i) for i in range(1, n + 1))}
        for n in range(2, 7)]


def _lf_similarity(pred: str, label: str) -> dict[str, float]:
    """LLaMA-Factory's ComputeSimilarity for one example (src/llamafactory/train/sft/metric.py), as the reference."""
    import jieba
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
    from rouge_chinese import Rouge

    hypothesis, reference = list(jieba.cut(pred)), list(jieba.cut(label))
    if len(" ".join(hypothesis).split()) == 0 or len(" ".join(reference).split()) == 0:
        result = {"rouge-1": {"f": 0.0}, "rouge-2": {"f": 0.0}, "rouge-l": {"f": 0.0}}
    else:
        result = Rouge().get_scores(" ".join(hypothesis), " ".join(reference))[0]
    out = {k: round(v["f"] * 100, 4) for k, v in result.items()}
    out["bleu-4"] = round(sentence_bleu([list(label)], list(pred),
                                        smoothing_function=SmoothingFunction().method3) * 100, 4)
    return out


@pytest.mark.parametrize("pred,label", [("1 2 3", "1 2 3"), ("one two three four", "one two four five"),
                                        ("", "1 2"), ("数到三", "数到四"), ("x", "")])
@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_scores_are_llamafactorys(pred, label):
    assert similarity(pred, label) == _lf_similarity(pred, label)
    if pred == label:
        assert similarity(pred, label) == {m: 100.0 for m in METRICS}


@pytest.fixture
def chat_run(tmp_path):
    from transformers import AutoTokenizer

    _, run, _ = lora_run_dir(tmp_path, lora_std=0.1)
    tok = AutoTokenizer.from_pretrained(run / "final")
    tok.chat_template = BUILTIN_TEMPLATES["chatml"]
    tok.save_pretrained(run / "final")
    data = tmp_path / "held.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return run, data


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_generation_eval_scores_greedy_answers_and_keeps_them(chat_run, tmp_path, capsys):
    import torch

    from scaletrain.after.chat import open_chat

    run, data = chat_run
    assert main(["eval", str(run), "--data", str(data), "--max-new-tokens", "6", "--limit", "4"]) == 0
    out = capsys.readouterr().out
    (written,) = list((run / "eval").glob("generate-held-*.json"))
    results = json.loads(written.read_text())
    predictions = results["predictions"]
    assert [p["label"] for p in predictions] == [r["output"] for r in ROWS[:4]]  # --limit 4
    chat = open_chat(run)
    first = chat.tokenizer.apply_chat_template([{"role": "user", "content": ROWS[0]["instruction"]}],
                                               add_generation_prompt=True, return_dict=True)["input_ids"]
    assert predictions[0]["prompt"] == chat.tokenizer.decode(first) and "<|im_start|>assistant\n" in \
        predictions[0]["prompt"]
    x = torch.tensor([first])
    greedy = chat.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=6, do_sample=False,
                                 pad_token_id=chat.tokenizer.eos_token_id)
    assert predictions[0]["predict"] == chat.tokenizer.decode(greedy[0, x.shape[1]:], skip_special_tokens=True)
    for p in predictions:
        assert {m: p[m] for m in METRICS} == _lf_similarity(p["predict"], p["label"])
    scores = results["results"]["held (generation)"]
    for m in METRICS:
        assert scores[f"{m},none"] == pytest.approx(sum(p[m] for p in predictions) / 4)
        assert f"held (generation)\t{m}\t{scores[f'{m},none']:.4f}" in out

    # a second evaluation never replaces the first; report A B shows the scores beside each other
    assert main(["eval", str(run), "--data", str(data), "--max-new-tokens", "6", "--limit", "2"]) == 0
    assert len(list((run / "eval").glob("generate-held-*.json"))) == 2
    capsys.readouterr()
    from scaletrain.report.compare import compare

    assert "| held (generation) bleu-4 |" in compare([run, run])


def test_bad_generation_eval_input_is_one_line(chat_run, tmp_path, capsys):
    run, data = chat_run
    assert main(["eval", str(run)]) != 0
    assert "give --tasks (lm-eval tasks), --data FILE (the generation eval), or both" in capsys.readouterr().err
    assert main(["eval", str(run), "--data", str(data), "--limit", "0.5"]) != 0
    assert "--limit 0.5: with --data, a number of records" in capsys.readouterr().err
    assert main(["eval", str(run), "--data", str(tmp_path / "none.jsonl")]) != 0
    assert "--data" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n{oops\n")
    assert main(["eval", str(run), "--data", str(bad)]) != 0
    assert f"--data={bad}: line 2 is not JSON" in capsys.readouterr().err
    assert main(["eval", str(run), "--data", "held_demo"]) != 0  # a name, with no dataset_info.json to look in
    assert "--data held_demo: no such file (to name datasets of a LLaMA-Factory dataset_info.json, give " \
           "--dataset-dir DIR)" in capsys.readouterr().err
    prompts_only = tmp_path / "prompts.jsonl"
    prompts_only.write_text(json.dumps({"instruction": "Hi", "input": ""}) + "\n")
    assert main(["eval", str(run), "--data", str(prompts_only)]) != 0
    assert "no record ends with an assistant reply" in capsys.readouterr().err


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_eval_data_takes_every_format_training_takes(chat_run, tmp_path, capsys):
    """A JSON array (the format LLaMA-Factory's data files have), and dataset names of a dataset_info.json with their
    own columns, give the predictions the JSON Lines file gives (#60: a JSON array was a 20-line traceback)."""
    run, jsonl = chat_run
    array = tmp_path / "held.json"
    array.write_text(json.dumps(ROWS))
    renamed = tmp_path / "lf" / "renamed.json"
    renamed.parent.mkdir()
    renamed.write_text(json.dumps([{"q": r["instruction"], "a": r["output"]} for r in ROWS]))
    (renamed.parent / "dataset_info.json").write_text(json.dumps(
        {"held_demo": {"file_name": "renamed.json", "columns": {"prompt": "q", "response": "a"}}}))
    import warnings

    predicted = []
    for args in (["--data", str(jsonl)], ["--data", str(array)],
                 ["--data", "held_demo", "--dataset-dir", str(renamed.parent)]):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert main(["eval", str(run), *args, "--max-new-tokens", "4", "--limit", "2"]) == 0, \
                capsys.readouterr().err
        assert [str(w.message) for w in seen if issubclass(w.category, FutureWarning)] == []  # #59: quiet output
        newest = max((run / "eval").glob("generate-*.json"), key=lambda p: p.stat().st_mtime_ns)
        predicted.append([(p["label"], p["predict"]) for p in json.loads(newest.read_text())["predictions"]])
    assert predicted[0] == predicted[1] == predicted[2] and len(predicted[0]) == 2
