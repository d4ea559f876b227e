"""Classification labels: class numbers or class names, resolved once from the training data.

Labels written as names ("positive") are normal: the set is collected from the training files (sorted, or in
the order of ``data.label_names``), every eval label must be one of them, and ``model.num_labels`` defaults to
its size. Numbers stay numbers (``num_labels`` defaults to the largest + 1). The names travel into ``final/``'s
config as ``id2label``/``label2id`` so a transformers ``pipeline`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config.schema import Config
from scaletrain.errors import DataError


@dataclass(frozen=True)
class Labels:
    num_labels: int
    names: tuple[str, ...] | None = None  # class names by id; None: numbered classes

    @property
    def label2id(self) -> dict[str, int] | None:
        return {n: i for i, n in enumerate(self.names)} if self.names else None


def _is_name(v) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def resolve_labels(cfg: Config, train: list[tuple[str, list]], evals: tuple[str, list] | None) -> Labels:
    """``train``: (the source's ``key=path``, its label column) per training source; ``evals`` likewise."""
    given_n, given_names = cfg.model.num_labels, cfg.data.label_names
    if given_n == 1:
        if given_names:
            raise DataError("data.label_names with model.num_labels: 1 (regression); remove one of them")
        return Labels(1)
    named = [v for _, col in train for v in col if _is_name(v)]
    numbers = [v for _, col in train for v in col if _is_number(v)]
    # Mostly numbers: the names are the odd records (skipped and counted), and the other way round.
    names_seen = set(named) if len(named) >= len(numbers) else set()
    if names_seen:
        if given_names:
            for where, col in train:
                _check_known(col, given_names, where, "data.label_names", "add it to data.label_names or fix "
                             "the record")
            names = tuple(given_names)
        else:
            names = tuple(sorted(names_seen))
        if evals:
            _check_known(evals[1], names, evals[0], "the training data",
                         "an eval label must be one the model learns; fix the eval file or the training data")
    else:
        names = tuple(given_names) if given_names else None
    if names is not None:
        if given_n is not None and given_n != len(names):
            raise DataError(f"model.num_labels={given_n} but the training data has {len(names)} classes "
                            f"({', '.join(names)}); remove model.num_labels or fix the data")
        return Labels(len(names), names)
    whole = [int(v) for v in numbers if v == int(v) and v >= 0]
    n = given_n if given_n is not None else max(2, max(whole, default=0) + 1)
    return Labels(n)


def _check_known(col: list, names, where: str, against: str, fix: str) -> None:
    known = set(names)
    for i, v in enumerate(col):
        if _is_name(v) and v not in known:
            raise DataError(f"{where}: label {v!r} (record {i + 1}) is not in {against} ({', '.join(names)}); {fix}")
