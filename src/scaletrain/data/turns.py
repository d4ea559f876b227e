"""Which turns of a chat train (data.multi_turn), said at start with the share of supervised tokens; and per_turn:
each assistant turn an example of its own (the render of the conversation up to it, encoded by
encode.encode_chat), flattened once every record is counted, with the conversation it comes from so the eval split
holds out whole conversations, and what that costs against one render per conversation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scaletrain.config.stages import RL_STAGES
from scaletrain.data.encode import IGNORE_INDEX
from scaletrain.errors import DataError

if TYPE_CHECKING:
    from scaletrain.config.schema import Config

CONVERSATION = "_conversation"  # the conversation an example comes from


def per_turn_cost(key: str, fulls: list[list[int]]) -> str:
    """What data.multi_turn: per_turn costs: its examples and tokens against one render per conversation (the
    last turn's render is the whole conversation)."""
    tokens, whole = sum(map(sum, fulls)), sum(f[-1] for f in fulls if f)
    return (f"data: {key}: multi_turn=per_turn: {sum(map(len, fulls))} examples from {len(fulls)} "
            f"conversations, {tokens:,} tokens to run: {tokens / max(whole, 1):.2f}x the {whole:,} of one render "
            f"per conversation (multi_turn=spans)")


def one_per_turn(batch: dict[str, list], indices: list[int], source: str) -> dict[str, list]:
    """Each conversation's per-turn examples as rows of their own (data.multi_turn: per_turn), with the
    conversation they come from (held out whole by the eval split: no turn of an eval conversation trains)."""
    return {"input_ids": [ids for turns in batch["turn_input_ids"] for ids in turns],
            CONVERSATION: [f"{source}#{i}" for i, turns in zip(indices, batch["turn_input_ids"]) for _ in turns],
            "labels": [labels for turns in batch["turn_labels"] for labels in turns],
            "_skip": ["" for turns in batch["turn_input_ids"] for _ in turns],
            "_full": [full for fulls in batch["_full"] for full in fulls]}


MULTI_TURN = {"spans": "every assistant turn of the whole conversation, as the template writes it",
              "last": "the last assistant turn only",
              "per_turn": "one example per assistant turn: the conversation up to it as the model sees it when it "
                          "writes that turn, the loss on that turn"}


def supervision_note(train, cfg: Config) -> str | None:
    """What trains of a chat dataset, said at start: which assistant turns (data.multi_turn) and the share of
    tokens that are labels, counted on the Arrow column (no token list in Python). A chat dataset where no token,
    or every token, is a label is an error: nothing would train, or the prompts would (a template whose assistant
    turns were not found)."""
    import pyarrow.compute as pc

    d = cfg.data
    if cfg.model.task != "causal-lm" or d.formatting == "text" or "labels" not in train.column_names or \
            cfg.train.stage in RL_STAGES:  # prompts: their completions are sampled, nothing of theirs is a label
        return None
    rows = train.with_format("arrow")["labels"]  # the selected rows, as Arrow
    labels = pc.list_flatten(rows)
    supervised, total = pc.sum(pc.not_equal(labels, IGNORE_INDEX)).as_py() or 0, len(labels)
    # A conversation's first token is the template's (a BOS, a role header), never the model's reply: a label there
    # in every example means the prompts train (the line break after the last turn is never a label).
    heads = pc.list_element(pc.filter(rows, pc.greater(pc.list_value_length(rows), 0)), 0)
    prompts_train = len(heads) > 0 and pc.all(pc.not_equal(heads, IGNORE_INDEX)).as_py()
    if total and supervised == 0:
        raise DataError(f"data: no token of the {len(train)} training examples is a label (nothing would train); "
                        f"check data.template and the assistant turns (scaletrain preview CONFIG shows them)")
    if total and (supervised == total or prompts_train) and not d.train_on_prompt:
        raise DataError(f"data.template: every token of the {len(train)} training examples is a label, prompts "
                        f"included (the template's assistant turns were not found); choose data.template (auto: the "
                        f"model's own), or set data.train_on_prompt=true if that is meant")
    what = "every token (data.train_on_prompt)" if d.train_on_prompt else MULTI_TURN[d.multi_turn]
    return (f"data: multi_turn={d.multi_turn}: {what}; {len(train)} train examples, {supervised:,} of {total:,} "
            f"tokens supervised ({100 * supervised / max(total, 1):.1f}%)")
