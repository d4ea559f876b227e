"""Typed config sections and the loader that validates them."""

from scaletrain.config.load import dump_config, load_config, validate
from scaletrain.config.schema import Config

__all__ = ["Config", "dump_config", "load_config", "validate"]
