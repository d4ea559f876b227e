"""Datasets -> tokenized examples -> padded batches.

The driver prepares the data once per job (``prepare_data``: Hugging Face ``datasets``, chat templates, a
fingerprinted cache); workers memory-map the tokenized splits (``load_split``) and never see a tokenizer or a
raw file.
"""

from scaletrain.data.collate import Collator, load_split, model_inputs
from scaletrain.data.encode import IGNORE_INDEX
from scaletrain.data.prepare import PreparedData, prepare_data

__all__ = ["IGNORE_INDEX", "Collator", "PreparedData", "load_split", "model_inputs", "prepare_data"]
