"""`scaletrain eval RUN_DIR --data FILE`: how close the run's model writes the held-out answers, scored as
LLaMA-Factory reports it (``predict_with_generate``: BLEU-4, ROUGE-1/2/L).

Each record of FILE (the run's own data format and columns) is a conversation; its last assistant turn is the
reference, everything before it the prompt, rendered by the chat template the run trained with (final/'s
tokenizer) with the generation prompt, answered greedily. The scores are LLaMA-Factory's ``ComputeSimilarity``
(src/llamafactory/train/sft/metric.py), so the numbers compare with an LF run's ``predict_*`` metrics: per example
ROUGE F1 (rouge_chinese) over jieba words, BLEU-4 over characters (nltk, smoothing method 3), each x 100 rounded to
4 places, then averaged. The predictions and the averages go to ``RUN_DIR/eval/generate-*.json`` (a new file each
time) in lm-eval's results shape, so the run's report and ``report A B`` show them beside lm-eval's.
"""

from __future__ import annotations

import json
from pathlib import Path

from scaletrain.errors import ConfigError, DataError
from scaletrain.report.evals import EVAL_DIR, write_new
from scaletrain.rundir import RunDir

METRICS = ("bleu-4", "rouge-1", "rouge-2", "rouge-l")


def similarity(prediction: str, reference: str) -> dict[str, float]:
    """LLaMA-Factory's per-example scores (x 100, 4 places)."""
    try:
        import jieba
        from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
        from rouge_chinese import Rouge
    except ImportError:
        raise ConfigError("eval --data needs jieba, nltk and rouge-chinese: pip install 'scaletrain[eval]'") from None
    jieba.setLogLevel(60)  # its "Building prefix dict" lines on stderr
    hypothesis, words = list(jieba.cut(prediction)), list(jieba.cut(reference))
    if not " ".join(hypothesis).split() or not " ".join(words).split():
        rouge = {"rouge-1": 0.0, "rouge-2": 0.0, "rouge-l": 0.0}
    else:
        scores = Rouge().get_scores(" ".join(hypothesis), " ".join(words))[0]
        rouge = {k: v["f"] for k, v in scores.items()}
    bleu = sentence_bleu([list(reference)], list(prediction), smoothing_function=SmoothingFunction().method3)
    return {"bleu-4": round(bleu * 100, 4), **{k: round(v * 100, 4) for k, v in rouge.items()}}


def held_out(run: RunDir, path: str | Path, limit: int | None) -> list[tuple[list[dict], list | None, str]]:
    """(prompt messages, tools, reference answer) of each usable record of ``path``, read in the run's data format
    and columns; a record whose last turn is not the assistant's is skipped (and counted)."""
    import yaml

    from scaletrain.config.data import DataConfig
    from scaletrain.data.formats import Columns, to_conversation

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--data {path}: no such file")
    # The run's format and columns, with the held-out file in the place of its training data.
    data = {k: v for k, v in (yaml.safe_load(run.resolved_config.read_text()).get("data") or {}).items()
            if k not in ("dataset", "dataset_dir", "eval_file", "eval_dataset")}
    d = DataConfig(**{**data, "train_file": str(p)})
    columns = Columns.from_config(d, d.formatting)
    pairs, skipped = [], 0
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise DataError(f"--data {path}:{n}: not JSON ({e}); one JSON object per line") from None
            chat, _ = to_conversation(row, d.formatting, columns)
            if chat is None or not chat.messages or chat.messages[-1]["role"] != "assistant":
                skipped += 1
                continue
            pairs.append((chat.messages[:-1], chat.tools, chat.messages[-1]["content"]))
            if limit and len(pairs) >= limit:
                break
    if not pairs:
        raise DataError(f"--data {path}: no record ends with an assistant reply in the run's format "
                        f"(data.formatting={d.formatting}); {skipped} skipped")
    return pairs


def generation_eval(run_dir: str | Path, data: str | Path, limit: int | None = None,
                    max_new_tokens: int = 256) -> tuple[dict, Path]:
    """Generate an answer for each held-out prompt, score it, write the results (see the module docstring)."""
    import torch

    from scaletrain.after.chat import open_chat

    run = RunDir(run_dir).require_run()
    pairs = held_out(run, data, limit)
    chat = open_chat(run.root)
    tok, predictions = chat.tokenizer, []
    for messages, tools, reference in pairs:
        ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                      return_dict=True)["input_ids"]
        x = torch.tensor([ids])
        with torch.no_grad():
            out = chat.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                      do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id)
        answer = tok.decode(out[0, x.shape[1]:], skip_special_tokens=True)
        predictions.append({"prompt": tok.decode(ids), "label": reference, "predict": answer,
                            **similarity(answer, reference)})
    averages = {m: sum(p[m] for p in predictions) / len(predictions) for m in METRICS}
    name = f"{Path(data).stem} (generation)"
    results = {"results": {name: {"alias": name, **{f"{m},none": v for m, v in averages.items()}}},
               "predictions": predictions,
               "scaletrain": {"evaluated": run.root.name, "data": str(data), "examples": len(predictions),
                              "max_new_tokens": max_new_tokens, "scored_as": "LLaMA-Factory ComputeSimilarity"}}
    return results, write_new(results, run.root / EVAL_DIR, f"generate-{Path(data).stem[:60]}")
