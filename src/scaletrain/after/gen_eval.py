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


def held_out(run: RunDir, data: str, limit: int | None,
             dataset_dir: str | None = None) -> list[tuple[list[dict], list | None, str, list]]:
    """(prompt messages, tools, reference answer, its images decoded) of each usable record of ``data``, read as
    training reads its
    data (data/sources.py: JSON arrays, JSON Lines, CSV, Parquet, Arrow, ``save_to_disk`` folders) in the run's
    format and columns; or ``data`` names datasets (``a,b``) of the ``dataset_info.json`` in ``dataset_dir``
    (default: the run's ``data.dataset_dir``), each with its own formatting and columns; a record's images (an
    ``images`` column, as in training) are read and bounded as training read them. A record whose last turn is not
    the assistant's is skipped (and counted)."""
    import tempfile

    from scaletrain.data.formats import to_conversation
    from scaletrain.data.images import media_base
    from scaletrain.data.sources import load

    d, srcs = _data_config(run, data, dataset_dir)
    pairs, skipped = [], 0
    with tempfile.TemporaryDirectory(prefix="scaletrain-eval-") as scratch:
        for src in srcs:
            loaded = load(src.path, src.file_format, "--data", scratch, d.encoding)
            media = media_base(d.media_dir, src.path)
            for i, row in enumerate(loaded.ds):
                chat, _ = to_conversation(row, src.formatting, src.columns)
                if chat is None or not chat.messages or chat.messages[-1]["role"] != "assistant":
                    skipped += 1
                    continue
                pairs.append((chat.messages[:-1], chat.tools, chat.messages[-1]["content"],
                              _images(row.get(src.columns.images) or [], media, d, f"--data {src.path}: "
                                      f"{loaded.unit} {loaded.position(i)}")))
                if limit and len(pairs) >= limit:
                    return pairs
    if not pairs:
        raise DataError(f"--data {data}: no record ends with an assistant reply in the run's format "
                        f"(data.formatting={d.formatting}); {skipped} skipped")
    return pairs


def _images(refs: list, media: str, d, where: str) -> list:
    """A record's images, decoded and bounded as the run's data step did; an unreadable one is one line."""
    from scaletrain.data.images import ImageProblem, load_images

    try:
        return load_images(list(refs), media, d.image_max_pixels, d.image_min_pixels)
    except ImageProblem as e:
        raise DataError(f"{where}: {e}; fix the path or the file") from None


def _data_config(run: RunDir, data: str, dataset_dir: str | None):
    """The run's data settings with ``data`` in the place of its training data, and the sources that gives."""
    import yaml

    from scaletrain.config.data import DataConfig
    from scaletrain.data.sources import INFO_FILE, named_sources, sources

    trained = yaml.safe_load(run.resolved_config.read_text())
    settings = {k: v for k, v in (trained.get("data") or {}).items()
                if k not in ("train_file", "dataset", "eval_file", "eval_dataset", "dataset_dir", "streaming")}
    stage = (trained.get("train") or {}).get("stage", "sft")
    folder = dataset_dir or (trained.get("data") or {}).get("dataset_dir")
    if Path(data).expanduser().exists() and dataset_dir is None:
        d = DataConfig(**settings, train_file=str(Path(data).expanduser()))
        return d, sources(d, "causal-lm", stage)
    if not folder:
        raise ConfigError(f"--data {data}: no such file (to name datasets of a LLaMA-Factory {INFO_FILE}, give "
                          f"--dataset-dir DIR)")
    if not (Path(folder).expanduser() / INFO_FILE).is_file():
        raise ConfigError(f"--data {data}: no such file, and {folder} holds no {INFO_FILE} naming datasets")
    d = DataConfig(**settings, dataset=data, dataset_dir=folder)
    return d, named_sources(d, d.dataset, "--data", stage)


def generation_eval(run_dir: str | Path, data: str | Path, limit: int | None = None,
                    max_new_tokens: int = 256, dataset_dir: str | None = None) -> tuple[dict, Path]:
    """Generate an answer for each held-out prompt, score it, write the results (see the module docstring)."""
    import torch

    from scaletrain.after.chat import open_chat

    run = RunDir(run_dir).require_run()
    pairs = held_out(run, str(data), limit, dataset_dir)
    chat = open_chat(run.root)
    tok, predictions = chat.tokenizer, []
    for messages, tools, reference, images in pairs:
        if images and chat.image_text is None:
            raise DataError(f"--data {data}: its records have images, and {run.root} trained a text model that "
                            f"cannot read them; evaluate a vision-language run, or give text-only records")
        if chat.image_text is not None:  # the prompt rendered and its images expanded as training did
            from scaletrain.data.vision import prompt_inputs

            inputs = prompt_inputs(messages, tok, chat.image_text, images)
        else:
            ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                          return_dict=True)["input_ids"]
            inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        x = inputs["input_ids"]
        with torch.no_grad():
            out = chat.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                      pad_token_id=tok.pad_token_id or tok.eos_token_id)
        answer = tok.decode(out[0, x.shape[1]:], skip_special_tokens=True)
        predictions.append({"prompt": tok.decode(x[0]), "label": reference, "predict": answer,
                            **similarity(answer, reference)})
    averages = {m: sum(p[m] for p in predictions) / len(predictions) for m in METRICS}
    name = f"{Path(data).stem} (generation)"
    results = {"results": {name: {"alias": name, **{f"{m},none": v for m, v in averages.items()}}},
               "predictions": predictions,
               "scaletrain": {"evaluated": run.root.name, "data": str(data), "examples": len(predictions),
                              "max_new_tokens": max_new_tokens, "scored_as": "LLaMA-Factory ComputeSimilarity"}}
    return results, write_new(results, run.root / EVAL_DIR, f"generate-{Path(data).stem[:60]}")
