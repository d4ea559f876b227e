"""Argument types with their ranges, for every numeric flag: a value out of range is argparse's one-line error
naming the flag and the range (``--straggler-cv -1: must be >= 0``), before the command does anything."""

from __future__ import annotations

import argparse
import math
from typing import Callable


def number(kind: type = int, low: float | None = None, high: float | None = None,
           above: bool = False) -> Callable[[str], float]:
    """A parser of ``kind`` values in [low, high] (``above``: low itself excluded)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'a whole number' if kind is int else 'a number'}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number")
        if low is not None and (value < low or (above and value == low)):
            raise argparse.ArgumentTypeError(f"{text}: must be {'>' if above else '>='} {low:g}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{text}: must be <= {high:g}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages by this
    return parse


COUNT = number(int, 1)  # workers, steps, examples, tokens, nodes: at least one
NONNEGATIVE = number(int, 0)
POSITIVE = number(float, 0, above=True)  # seconds, bytes, megabytes, hours
NONNEGATIVE_REAL = number(float, 0)
SHARE = number(float, 0, 1)  # a fraction
