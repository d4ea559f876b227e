"""A local model directory as files, checked before anything starts: config.json parses and names a model type
the installed transformers knows (and a dtype scaletrain trains from), weights and a tokenizer are present, and
every safetensors file is whole. Read from the files alone (headers, never the tensors)."""

from __future__ import annotations

from pathlib import Path

from scaletrain.errors import ConfigError
from scaletrain.precision import TORCH_NAMES


def read_model_config(path: Path, name: str) -> dict:
    """``config.json`` as a dict: JSON text whose ``model_type`` the installed transformers knows."""
    import json

    from transformers import CONFIG_MAPPING, __version__

    f = path / "config.json"
    try:
        config = json.loads(f.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"model.name_or_path={name}: {f} is not UTF-8 text; download the model again") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"model.name_or_path={name}: {f} is not JSON (line {e.lineno}: {e.msg}); download the "
                          f"model again or fix the file") from None
    if not isinstance(config, dict):
        raise ConfigError(f"model.name_or_path={name}: {f} holds a JSON {type(config).__name__}, not an object; "
                          f"download the model again")
    stored = config.get("dtype") or config.get("torch_dtype")
    if stored is not None and str(stored).removeprefix("torch.") not in (*TORCH_NAMES, "auto"):
        raise ConfigError(f"model.name_or_path={name}: config.json stores its weights as {stored!r}, a dtype "
                          f"scaletrain does not train from ({', '.join(TORCH_NAMES)}); fix config.json's torch_dtype "
                          f"or convert the checkpoint")
    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        known = "no model_type" if model_type is None else f"model_type {model_type!r}"
        raise ConfigError(f"model.name_or_path={name}: {f} has {known}, which transformers {__version__} does not "
                          f"know; upgrade transformers (pip install -U transformers) or fix config.json")
    return config


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")


def check_files(path: Path, name: str) -> None:
    """Weights and a tokenizer are present (a directory with only config.json serves `plan`, not `train`)."""
    if not any((path / w).is_file() for w in WEIGHT_FILES):
        raise ConfigError(f"model.name_or_path={name}: {path} has no weights ({', '.join(WEIGHT_FILES[::2])} or "
                          f"their index); download the whole model, not only its config")
    check_tokenizer_files(path, name)


def check_tokenizer_files(path: Path, name: str) -> None:
    if not any((path / t).is_file() for t in TOKENIZER_FILES):
        raise ConfigError(f"model.name_or_path={name}: {path} has no tokenizer ({', '.join(TOKENIZER_FILES[:4])}, "
                          f"...); copy the tokenizer of the model it was trained from into it "
                          f"(AutoTokenizer.from_pretrained(BASE).save_pretrained(DIR))")


def check_weights(path: Path, name: str) -> None:
    """Every ``*.safetensors`` file of ``path`` is whole: its header parses and its tensors' byte ranges end at
    the file's end (read from the header only, never the tensors); a missing shard of an index is named."""
    import json
    import struct

    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (json.JSONDecodeError, KeyError, AttributeError):
            raise ConfigError(f"model.name_or_path={name}: {index.name} is unreadable; download the model again") \
                from None
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise ConfigError(f"model.name_or_path={name}: {', '.join(missing)} named in {index.name} is missing; "
                              f"download the model again")
    for f in sorted(path.glob("*.safetensors")):
        size = f.stat().st_size
        problem = None
        with open(f, "rb") as fh:
            head = fh.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            if n is None or 8 + n > size:
                problem = "its header is cut short"
            else:
                try:
                    header = json.loads(fh.read(n))
                    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
                except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, IndexError):
                    problem = "its header is unreadable"
                else:
                    if 8 + n + end != size:
                        problem = f"it has {size} bytes but its header describes {8 + n + end}"
        if problem:
            raise ConfigError(f"model.name_or_path={name}: {f.name} is damaged ({problem}; a download or copy that "
                              f"stopped early?); download the model again")
