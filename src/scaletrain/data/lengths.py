"""Per-row list lengths of a prepared split, read from Arrow: what the driver's planning passes need (the balancing
``length`` column, the truncation note) without turning token ids into Python objects."""

from __future__ import annotations

from scaletrain.data.pairs import PAIR_COLUMNS

LENGTH_BATCH = 65_536  # rows per Arrow batch of a length pass


def list_lengths(ds, column: str):
    """The length of each row's list in ``column`` (int32 numpy), read from Arrow batch by batch: no token becomes a
    Python object, and memory beyond the result is one batch (a 10M-row set of 500 tokens a row would be over 100 GB
    as Python lists; its lengths are 40 MB)."""
    import numpy as np
    import pyarrow.compute as pc

    parts = [pc.list_value_length(batch[column]).to_numpy(zero_copy_only=False)
             for batch in ds.select_columns([column]).with_format("arrow").iter(batch_size=LENGTH_BATCH)]
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, dtype=np.int32)


def example_lengths(ds):
    """Tokens of each example (int32 numpy): a preference pair counts both sides (one forward runs both)."""
    if PAIR_COLUMNS[0] in ds.column_names:
        return list_lengths(ds, PAIR_COLUMNS[0]) + list_lengths(ds, PAIR_COLUMNS[2])
    return list_lengths(ds, "input_ids")
