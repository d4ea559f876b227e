"""What a worker does with the prepared data: memory-map its split and pad batches of it."""

from __future__ import annotations

import torch

from scaletrain.data.encode import IGNORE_INDEX


def load_split(path: str):
    """The tokenized split the driver saved (Arrow, memory-mapped: no copy per worker)."""
    import datasets

    return datasets.load_from_disk(path)


class Collator:
    """Pads a list of examples to the longest one in the batch (right padding)."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(ex["input_ids"]) for ex in batch)
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        seq_labels = isinstance(batch[0]["labels"], list)
        labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long) if seq_labels else None
        for i, ex in enumerate(batch):
            n = len(ex["input_ids"])
            ids[i, :n] = torch.tensor(ex["input_ids"])
            mask[i, :n] = 1
            if seq_labels:
                labels[i, :n] = torch.tensor(ex["labels"])
        if not seq_labels:
            dtype = torch.float if isinstance(batch[0]["labels"], float) else torch.long
            labels = torch.tensor([ex["labels"] for ex in batch], dtype=dtype)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
