"""Packing: tokenized examples -> rows of at most ``max_length`` tokens, and per-example lengths for balancing.

First-fit decreasing inside a seeded window of examples: the order is the same on every run of the config
(and so resumable), rows are nearly full, and no example is split. Each row carries ``position_ids`` that
restart at 0 for every example, so attention never crosses an example: a model on SDPA attends per example
(``attention.py``); with no attention mask, transformers builds a block-diagonal causal mask for eager
attention (``masking_utils.find_packed_sequence_indices``) and runs varlen for flash-attention kernels. The
first token of each example is no target (its label is ignored): it would be predicted from the previous
example's last token.
"""

from __future__ import annotations

import random

from scaletrain.data.encode import IGNORE_INDEX

WINDOW = 1000  # examples sorted together: larger packs tighter, smaller keeps the order closer to the shuffle


def pack(split, max_length: int, seed: int):
    """A new ``datasets.Dataset`` of packed rows: input_ids, labels, position_ids, examples (per row)."""
    import datasets

    ids, labels = split["input_ids"], split["labels"]
    order = list(range(len(ids)))
    random.Random(seed).shuffle(order)
    rows: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": [], "examples": []}
    for w in range(0, len(order), WINDOW):
        window = sorted(order[w:w + WINDOW], key=lambda i: len(ids[i]), reverse=True)
        bins: list[list[int]] = []
        room: list[int] = []
        for i in window:
            n = len(ids[i])
            slot = next((b for b, free in enumerate(room) if free >= n), None)
            if slot is None:
                bins.append([i])
                room.append(max_length - n)
            else:
                bins[slot].append(i)
                room[slot] -= n
        for members in bins:
            row_ids, row_labels, row_pos = [], [], []
            for i in members:
                row_ids += ids[i]
                row_labels += [IGNORE_INDEX] + list(labels[i][1:])
                row_pos += list(range(len(ids[i])))
            rows["input_ids"].append(row_ids)
            rows["labels"].append(row_labels)
            rows["position_ids"].append(row_pos)
            rows["examples"].append(len(members))
    return datasets.Dataset.from_dict(rows)
