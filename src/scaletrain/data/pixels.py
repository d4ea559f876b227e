"""A batch's images made while training (#73): the data step's cache holds each image's reference and token count,
never its pixels; the collator, in the data-loading workers of the rank that trains on the batch (``DataLoader``'s
``num_workers``: ahead of the step, prefetched), reads each image, bounds it as the data step sized it and runs the
model's image processor on it, as LLaMA-Factory's collator and ms-swift's lazy dataset do.

An image that cannot be used when a worker opens it (missing, damaged, or changed since the data step so that its
token count no longer matches the tokens written for it) never stops the run and never leaves a hang: the record
it belongs to is blanked out of the batch (its tokens made padding, no target), counted in the batch
(``images_skipped``, logged as ``data/images_skipped``) and named on stderr; a batch left with no image runs the
tower on the stand-in (collate.py StandIn), so no rank waits for another.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable

import torch

from scaletrain.data.encode import IGNORE_INDEX
from scaletrain.data.images import ImageProblem, load_images


@dataclass
class Pixels:
    """Reads and processes images for the collator: ``process`` is the model's image processor on a list of decoded
    images (model/processor.py ``ImageText.preprocess``: ``pixel_values``, Qwen-VL's ``image_grid_thw``,
    ``tokens``), with the data step's bounds."""

    process: Callable[[list], dict]
    max_pixels: int
    min_pixels: int
    image_token_id: int  # the model's image token: its mask is the input_ids that are it
    types: str  # the name the model takes that mask under (data/vision.py type_column)
    skipped: int = field(default=0)  # on this process (a loader worker's own count; batches carry theirs)

    def image(self, where: str, tokens: int) -> dict:
        """One image's processor output; ImageProblem when it cannot be read or its token count is not
        ``tokens`` (the count its text was written with)."""
        out = self.processed(where)
        if out["tokens"][0] != tokens:
            raise ImageProblem(f"image {where} gives {out['tokens'][0]} image tokens now and gave {tokens} when the "
                               f"data was prepared (it changed since)")
        return out

    def processed(self, where: str) -> dict:
        """One image read, bounded and processed (ImageProblem when it cannot be read)."""
        (image,) = load_images([where], "", self.max_pixels, self.min_pixels)
        return self.process([image])

    def rate(self, refs: list[str]) -> float | None:
        """Images per CPU-second this process makes of ``refs`` (decode, bound, process): what one data-loading
        worker gives; None when none of them could be read."""
        import time

        done, cpu0 = 0, time.process_time()
        for where in refs:
            try:
                self.processed(where)
                done += 1
            except ImageProblem:
                continue
        cpu = time.process_time() - cpu0
        return done / cpu if done and cpu > 0 else None

    def said(self, problem: ImageProblem) -> None:
        self.skipped += 1
        print(f"scaletrain: {problem}; its record is skipped from this batch ({self.skipped} image(s) skipped so far "
              f"in this loader)", file=sys.stderr, flush=True)


def batch_images(out: dict, batch: list[dict], pixels: Pixels, pad_token_id: int) -> dict:
    """``out`` (the collated token tensors of ``batch``) with the rows' images processed: ``pixel_values`` (every
    image's in row order; Qwen-VL: with ``image_grid_thw``), and ``images_skipped``; a record whose image cannot
    be used blanked."""
    import numpy as np

    types_name = pixels.types
    done, skipped = [], 0
    for row, ex in enumerate(batch):
        images = list(zip(ex["image_refs"], ex["image_tokens"]))
        runs = _runs(out[types_name][row])
        members = _members(out, row)
        bad = set()
        processed = []
        for k, (where, tokens) in enumerate(images):
            member = _member_of(members, runs[k][0]) if k < len(runs) else None
            if member in bad:
                continue
            try:
                processed.append((member, pixels.image(where, tokens)))
            except ImageProblem as problem:
                pixels.said(problem)
                bad.add(member)
                skipped += 1
        for member in bad:
            _blank(out, row, members[member], types_name, pad_token_id)
        done += [p for member, p in processed if member not in bad]
    if done:
        out["pixel_values"] = torch.cat([torch.from_numpy(np.ascontiguousarray(p["pixel_values"])) for p in done])
        if "image_grid_thw" in done[0]:
            out["image_grid_thw"] = torch.cat([torch.as_tensor(np.asarray(p["image_grid_thw"]), dtype=torch.long)
                                               for p in done])
    out["images_skipped"] = torch.tensor(skipped)
    return out


def _runs(types: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of image tokens in a row (one per image, in order)."""
    flags = types.tolist()
    runs, i = [], 0
    while i < len(flags):
        if flags[i]:
            j = i
            while j < len(flags) and flags[j]:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    return runs


def _members(out: dict, row: int) -> list[tuple[int, int]]:
    """[start, end) of each example in a row: a packed row's members (their positions start again at 0), else the
    whole row."""
    width = out["input_ids"].shape[1]
    if "position_ids" not in out:
        return [(0, width)]
    starts = (out["position_ids"][row] == 0).nonzero().flatten().tolist()
    return [(s, e) for s, e in zip(starts, starts[1:] + [width])]


def _member_of(members: list[tuple[int, int]], at: int) -> int:
    return next(k for k, (s, e) in enumerate(members) if s <= at < e)


def _blank(out: dict, row: int, span: tuple[int, int], types_name: str, pad_token_id: int) -> None:
    """The example in ``span`` of ``row`` made padding tokens: no target, no image token. Its attention mask stays
    (a row of no attended token breaks Qwen-VL's position ids: ``get_rope_index`` concatenates nothing); without a
    target it adds nothing to the loss or the gradients."""
    s, e = span
    out["input_ids"][row, s:e] = pad_token_id
    out["labels"][row, s:e] = IGNORE_INDEX
    out[types_name][row, s:e] = 0


def loader_line(rate: float | None, measured: int, images_per_step: float, loader_workers: int) -> str:
    """What the data-loading workers give against what a step needs, per rank (plan, and a run's start)."""
    if rate is None:
        return f"images: none of the {measured} sampled could be read to time the loaders"
    core_s = images_per_step / rate
    where = (f"data.loader_workers={loader_workers} per rank make them ahead of the step" if loader_workers else
             "data.loader_workers=0: the training process makes them, in the step's time; set it to 1 or more to "
             "overlap them with the step")
    return (f"images: the loaders make {rate:.1f} images/s per core (decode, bound, process; timed on {measured} of "
            f"the data's images here); a step needs {images_per_step:.1f} a rank: {core_s:.2f} core-s a step; "
            f"{where}")
