"""What a worker does with the prepared data: memory-map its split and pad batches of it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scaletrain.data.encode import IGNORE_INDEX
from scaletrain.data.pixels import Pixels, batch_images


def load_split(path: str):
    """The tokenized split the driver saved (Arrow, memory-mapped: no copy per worker)."""
    import datasets

    return datasets.load_from_disk(path)


# What a batch says about itself besides the model's inputs: real (non-padding) tokens and examples in it, and
# (preference pairs) the reference model's precomputed log-probabilities.
STATS = ("num_tokens", "num_examples", "ref_logps", "kto_tag", "extra", "prompt_index", "images_skipped")
# What a context-parallel shard carries besides (context_parallel.shard_batch): targets already shifted, and the
# whole row's position ids for the attention.
SHARD_KEYS = ("shift_labels", "cp_positions")


def model_inputs(batch: dict, labels: bool = True) -> dict:
    """The keys of a batch the model's forward takes."""
    return {k: v for k, v in batch.items() if k not in STATS and k not in SHARD_KEYS and (labels or k != "labels")}


@dataclass(frozen=True)
class StandIn:
    """An image for a batch of image data that has none (#62: no rank waits for another). Every rank of a job
    whose data has images runs the vision tower in every micro-batch: a rank that skipped it would leave the
    others waiting in its FSDP all-gathers (or DDP's reduction of a trainable tower's gradients). This image's
    tokens are appended to the first row where nothing sees them (attention mask 0, or an example of its own in a
    packed row; no target; LLaMA-Factory's fake image), so the loss and every other token's output are what they
    are without it."""

    image_token_id: int
    tokens: int  # the image's tokens in the text
    pixel_shape: tuple[int, ...]  # its pixel_values
    grid: tuple[int, ...] = ()  # Qwen-VL: its (t, h, w) patches

    def added(self, out: dict, pad_token_id: int) -> dict:
        ids, labels = out["input_ids"], out["labels"]
        rows, k = ids.shape[0], self.tokens
        extra = torch.zeros((rows, k), dtype=torch.long)
        image = extra.clone()
        image[0] = 1
        out = {**out, "input_ids": torch.cat([ids, torch.where(image.bool(), self.image_token_id, pad_token_id)], 1),
               "labels": torch.cat([labels, extra.fill_(IGNORE_INDEX)], 1),
               "pixel_values": torch.zeros(self.pixel_shape)}
        if "position_ids" in out:  # packed rows: an example of its own (positions from 0), which nothing attends to
            out["position_ids"] = torch.cat([out["position_ids"], torch.arange(k).repeat(rows, 1)], 1)
        else:
            out["attention_mask"] = torch.cat([out["attention_mask"], torch.zeros((rows, k), dtype=torch.long)], 1)
        for name in ("token_type_ids", "mm_token_type_ids"):
            if name in out:
                out[name] = torch.cat([out[name], image], 1)
        if self.grid:
            out["image_grid_thw"] = torch.tensor([self.grid], dtype=torch.long)
        return out


class Collator:
    """Pads a list of examples to the longest one in the batch (right padding).

    Packed rows (with ``position_ids``) get no attention mask: the position ids tell the examples apart
    (``attention.py``, or transformers' block-diagonal mask), and the padding's own positions (0, 1, ...) make it
    an example of its own, with no targets."""

    def __init__(self, pad_token_id: int, stand_in: StandIn | None = None, pixels: Pixels | None = None):
        self.pad_token_id = pad_token_id
        self.stand_in = stand_in
        self.pixels = pixels  # a vision-language job: its images read and processed here (data/pixels.py)

    def __call__(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        if "kto_tag" in batch[0]:
            return self._kto(batch)
        if "chosen_input_ids" in batch[0]:  # preference pairs: one batch of the chosen sides, then the rejected
            sides = [{"input_ids": ex[f"{side}_input_ids"], "labels": ex[f"{side}_labels"], **_images_of_side(ex, side)}
                     for side in ("chosen", "rejected") for ex in batch]  # a side's images: the pair's, again
            out = {**self(sides), "num_examples": torch.tensor(len(batch))}
            if "ref_logps" in batch[0]:  # [pairs, 2]: the reference's chosen and rejected log-probabilities
                out["ref_logps"] = torch.tensor([ex["ref_logps"] for ex in batch], dtype=torch.float32)
            return out
        width = max(len(ex["input_ids"]) for ex in batch)
        packed = "position_ids" in batch[0]
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        positions = torch.arange(width).repeat(len(batch), 1) if packed else None
        seq_labels = isinstance(batch[0]["labels"], list)
        labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long) if seq_labels else None
        for i, ex in enumerate(batch):
            n = len(ex["input_ids"])
            ids[i, :n] = torch.tensor(ex["input_ids"])
            mask[i, :n] = 1
            if seq_labels:
                labels[i, :n] = torch.tensor(ex["labels"])
            if packed:
                positions[i, :n] = torch.tensor(ex["position_ids"])
                positions[i, n:] = torch.arange(width - n)
        if not seq_labels:
            dtype = torch.float if isinstance(batch[0]["labels"], float) else torch.long
            labels = torch.tensor([ex["labels"] for ex in batch], dtype=dtype)
        out = {"input_ids": ids, "labels": labels}
        out.update({"position_ids": positions} if packed else {"attention_mask": mask})
        out["num_tokens"] = mask.sum()
        out["num_examples"] = torch.tensor(sum(ex.get("examples", 1) for ex in batch))
        if "image_refs" in batch[0]:  # a vision-language model's images (data/vision.py, data/pixels.py)
            if self.pixels is None:
                raise ValueError("rows with images need the collator's Pixels (the model's image processor)")
            out[self.pixels.types] = (out["input_ids"] == self.pixels.image_token_id).long()  # the image-token mask
            out = batch_images(out, batch, self.pixels, self.pad_token_id)
            if "pixel_values" not in out and self.stand_in is not None:
                out = self.stand_in.added(out, self.pad_token_id)
        if "extra" in batch[0]:  # GRPO prompts: what the rewards read and the index that seeds the sampling
            out["extra"] = [ex["extra"] for ex in batch]
            out["prompt_index"] = torch.tensor([ex["prompt_index"] for ex in batch])
        return out

    def _kto(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        """KTO: the examples, then each prompt with the previous example's reply (TRL's mismatched pairs, for the
        KL estimate; cut to the batch's longest example), and the tags."""
        cap = max(len(ex["input_ids"]) for ex in batch)
        mismatched = []
        for ex, other in zip(batch, batch[-1:] + batch[:-1]):
            n, m = ex["prompt_len"], other["prompt_len"]
            mismatched.append({"input_ids": (ex["input_ids"][:n] + other["input_ids"][m:])[:cap],
                               "labels": ([IGNORE_INDEX] * n + other["labels"][m:])[:cap]})
        plain = [{"input_ids": ex["input_ids"], "labels": ex["labels"]} for ex in batch]
        return {**self(plain + mismatched), "num_examples": torch.tensor(len(batch)),
                "kto_tag": torch.tensor([bool(ex["kto_tag"]) for ex in batch])}


def _images_of_side(ex: dict, side: str) -> dict:
    """A preference pair's images and one side's image-token mask, as an SFT row carries them (data/vision.py)."""
    if "image_refs" not in ex:
        return {}
    return {k: ex[k] for k in ("image_refs", "image_grid_thw", "image_tokens")}

