"""Offline, learnable demo data: a sentiment task and an alpaca-format SFT task.

``python -m scaletrain.data.demo DIR`` writes ``DIR/sentiment.jsonl``, ``DIR/sentiment.csv``,
``DIR/reviews.jsonl`` (six-sentence reviews, ~64 tokens, for the scaling benchmark) and ``DIR/alpaca.json``.
Labels follow from the words (not random), so a model can beat chance.
"""

from __future__ import annotations

import csv
import json
import random
import sys
from pathlib import Path

POSITIVE = ["great", "wonderful", "excellent", "delightful", "superb", "charming", "brilliant", "lovely",
            "fantastic", "enjoyable", "moving", "clever", "fresh", "gripping", "beautiful", "warm"]
NEGATIVE = ["terrible", "awful", "boring", "dull", "dreadful", "clumsy", "tedious", "bland",
            "disappointing", "painful", "messy", "weak", "lifeless", "annoying", "ugly", "stale"]
SUBJECTS = ["the film", "this movie", "the plot", "the acting", "the soundtrack", "the ending", "the script",
            "the story", "the cast", "the direction", "the dialogue", "the pacing"]
TEMPLATES = ["{s} was {a}.", "honestly, {s} felt {a} and {b}.", "i thought {s} was {a}, really {b}.",
             "{s} is {a}; the rest was {b} too.", "what a {a} experience: {s} was {b}."]

ANTONYMS = {"hot": "cold", "big": "small", "up": "down", "fast": "slow", "light": "dark", "open": "closed",
            "early": "late", "happy": "sad", "full": "empty", "hard": "soft", "high": "low", "new": "old",
            "rich": "poor", "strong": "weak", "wet": "dry", "young": "old", "long": "short", "near": "far"}


def sentiment_rows(n: int, seed: int = 0, sentences: int = 1) -> list[dict]:
    """``n`` reviews of ``sentences`` sentences each (one sentence is ~11 MiniLM tokens), all of one label."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randint(0, 1)
        words = POSITIVE if label else NEGATIVE
        parts = []
        for _ in range(sentences):
            a, b = rng.sample(words, 2)
            parts.append(rng.choice(TEMPLATES).format(s=rng.choice(SUBJECTS), a=a, b=b))
        rows.append({"text": " ".join(parts), "label": label})
    return rows


def alpaca_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    pairs = list(ANTONYMS.items()) + [(v, k) for k, v in ANTONYMS.items() if v != "old"]
    rows = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.5:
            word, opposite = rng.choice(pairs)
            rows.append({"instruction": "Give the opposite of the word.", "input": word, "output": opposite})
        else:
            label = rng.randint(0, 1)
            a = rng.choice(POSITIVE if label else NEGATIVE)
            text = f"{rng.choice(SUBJECTS)} was {a}."
            rows.append({"instruction": "Is this review positive or negative?", "input": text,
                         "output": "positive" if label else "negative"})
    return rows


def sharegpt_rows(n: int, seed: int = 0) -> list[dict]:
    """Multi-turn conversations in LLaMA-Factory's sharegpt format, built from the alpaca tasks (2-3 turns each,
    some with a system prompt)."""
    rng = random.Random(seed)
    tasks = alpaca_rows(n * 3, seed=seed)
    rows = []
    for i in range(n):
        turns = []
        if rng.random() < 0.5:
            turns.append({"from": "system", "value": "Answer with one word."})
        for t in tasks[i * 3: i * 3 + rng.randint(2, 3)]:
            turns += [{"from": "human", "value": f"{t['instruction']}\n{t['input']}"},
                      {"from": "gpt", "value": t["output"]}]
        rows.append({"conversations": turns})
    return rows


def preference_rows(n: int, seed: int = 0) -> list[dict]:
    """Preference pairs in LLaMA-Factory's alpaca ranking format: the alpaca tasks with the right answer chosen, in
    a sentence, and a wrong one (the word itself, or the other sentiment) rejected, bare: a trait a small model
    learns in a few dozen steps (the chosen replies' form), and one it learns later (their content)."""
    rows = []
    for r in alpaca_rows(n, seed=seed):
        wrong = (("negative" if r["output"] == "positive" else "positive") if r["output"] in ("positive", "negative")
                 else r["input"])
        rows.append({"instruction": r["instruction"], "input": r["input"], "chosen": f"The answer is {r['output']}.",
                     "rejected": wrong})
    return rows


def kto_rows(n: int, seed: int = 0) -> list[dict]:
    """KTO's unpaired examples (alpaca with a ``kto_tag``): half the preference pairs' chosen replies tagged
    desirable, half their rejected replies tagged undesirable."""
    rows = []
    for i, r in enumerate(preference_rows(n, seed=seed)):
        good = i % 2 == 0
        rows.append({"instruction": r["instruction"], "input": r["input"],
                     "output": r["chosen"] if good else r["rejected"], "kto_tag": good})
    return rows


def write_demo_data(out_dir: str | Path, n_sentiment: int = 1200, n_alpaca: int = 600,
                    n_reviews: int = 1200) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = sentiment_rows(n_sentiment)
    with open(out / "sentiment.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    with open(out / "sentiment.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["text", "label"])
        w.writeheader()
        w.writerows(rows)
    with open(out / "reviews.jsonl", "w") as f:
        for r in sentiment_rows(n_reviews, seed=1, sentences=6):
            f.write(json.dumps(r) + "\n")
    (out / "alpaca.json").write_text(json.dumps(alpaca_rows(n_alpaca), indent=1))
    with open(out / "chat.jsonl", "w") as f:
        for r in sharegpt_rows(n_alpaca):
            f.write(json.dumps(r) + "\n")
    with open(out / "preference.jsonl", "w") as f:
        for r in preference_rows(n_alpaca, seed=2):
            f.write(json.dumps(r) + "\n")
    return out


def tokenizer_corpus() -> list[str]:
    """The fixed text builtin:tiny-llama's byte-level BPE is trained on (model.py): the demo tasks' words and
    the built-in templates' markers, so the same vocabulary comes out every time."""
    return ([r["text"] for r in sentiment_rows(400, seed=3)]
            + [f"{r['instruction']}\n{r['input']}\n{r['output']}" for r in alpaca_rows(400, seed=3)]
            + ["### Instruction:\n### Input:\n### Response:\nuser\nassistant\nsystem\n"])


if __name__ == "__main__":
    print(write_demo_data(sys.argv[1] if len(sys.argv) > 1 else "examples/data"))
