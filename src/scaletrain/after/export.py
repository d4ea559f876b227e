"""`scaletrain export RUN_DIR`: a standalone Hugging Face model directory from a run's ``final/``.

A LoRA run's adapter is merged into the base one safetensors shard at a time: each base shard is read, every
weight the adapter targets gets W + scale x B @ A (scale alpha / r, or alpha / sqrt(r) with rank-stabilised
LoRA; transposed for fan_in_fan_out layers), ``modules_to_save`` replace their weights, and the shard is written
under its own name before the next is read. LoRA on an MoE's fused expert weights (peft's ``target_parameters``)
is merged into the experts as the checkpoint stores them (fused_lora.py). Peak host memory is one input shard, one
output shard and the adapter (with fused experts, also one fused parameter's delta), whatever the model size
(peft's ``merge_and_unload`` builds the whole model first: ~16 GB of RAM for an 8B model; axolotl merges shard by
shard for the same reason). Written here because peft merges modules, not
checkpoint files. A full fine-tune's ``final/`` is already a model directory; its shards are copied, cast shard by
shard when another dtype is asked.

Beside the weights: the index (with the new total size), config.json naming the dtype written, the tokenizer with
the chat template the run trained with, generation_config.json. The target is never an existing path, and the
free space is checked before the first byte.
"""

from __future__ import annotations

import json
import math
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from scaletrain.errors import ConfigError
from scaletrain.model.dtypes import BYTES, checkpoint_dtype, torch_dtype, torch_name
from scaletrain.model.files import model_dir
from scaletrain.model.fused_lora import PEFT_PREFIX, FusedDeltas
from scaletrain.model.processor import PROCESSOR_FILES
from scaletrain.rundir import RunDir

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
INDEX = "model.safetensors.index.json"
# What travels with the weights (when the source has it): the model's config and generation settings, the
# tokenizer's files with the chat template the run trained with.
BESIDE = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "chat_template.jinja", "added_tokens.json",
          *PROCESSOR_FILES)


@dataclass(frozen=True)
class Exported:
    path: Path
    shards: int
    merged: int  # base weights a LoRA delta was added to
    replaced: int  # modules_to_save tensors written over the base's
    dtype: str
    bytes: int


def shards_of(directory: Path) -> list[str]:
    """The safetensors files of a model directory, in index order (or the single model.safetensors)."""
    index = directory / INDEX
    if index.is_file():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    if (directory / "model.safetensors").is_file():
        return ["model.safetensors"]
    bins = sorted(p.name for p in directory.glob("*.bin"))
    raise ConfigError(f"{directory}: no safetensors weights" + (f" ({', '.join(bins)}: PyTorch pickles, which "
                      f"export does not read; convert them with transformers' save_pretrained)" if bins else ""))


def _target(out: str | Path | None, run: RunDir) -> Path:
    target = Path(out).expanduser().resolve() if out else run.root / "export"
    if target.exists():
        raise ConfigError(f"export -o {target}: exists; an export never overwrites (choose another -o or remove it)")
    return target


def _check_space(target: Path, need: int) -> None:
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(parent).free
    if free < need * 1.05:
        raise ConfigError(f"export: {parent} has {free / 1e9:.2f} GB free and the export needs {need / 1e9:.2f} GB; "
                          f"free space or give -o on a larger disk")


def _dtype_of(directory: Path) -> str:
    config = json.loads((directory / "config.json").read_text())
    return checkpoint_dtype(config) or "fp32"


def _copy_beside(sources: list[Path], target: Path, dtype: str) -> None:
    """config.json (naming ``dtype``) from the first source that has it, the other files from the first that has
    each (the run's final/ first: its tokenizer carries the template it trained with)."""
    for name in ("config.json", *BESIDE):
        src = next((d / name for d in sources if (d / name).is_file()), None)
        if src is not None:
            shutil.copyfile(src, target / name)
    config = json.loads((target / "config.json").read_text())
    for key in ("dtype", "torch_dtype"):
        if key in config or key == "dtype":
            config[key] = torch_name(dtype)
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


class Adapter:
    """A saved peft LoRA adapter: its settings and tensors, keyed by the base checkpoint's weight each one changes
    (LoRA on an MoE's fused expert weights through ``fused``: see fused_lora.py)."""

    def __init__(self, directory: Path, base: Path):
        from safetensors.torch import load_file

        settings = json.loads((directory / ADAPTER_CONFIG).read_text())
        if settings.get("peft_type", "LORA") != "LORA":
            raise ConfigError(f"{directory}: a {settings['peft_type']} adapter; export merges LoRA adapters only")
        self.dora = bool(settings.get("use_dora"))
        if self.dora and settings.get("target_parameters"):
            raise ConfigError(f"{directory}: a DoRA adapter on fused parameters; export merges DoRA on modules only")
        r, alpha = settings["r"], settings.get("lora_alpha", settings["r"])
        self.scale = alpha / math.sqrt(r) if settings.get("use_rslora") else alpha / r
        self.fan_in_fan_out = bool(settings.get("fan_in_fan_out"))
        if settings.get("rank_pattern") or settings.get("alpha_pattern"):
            raise ConfigError(f"{directory}: rank_pattern/alpha_pattern adapters are not merged by export yet; set "
                              f"output.merge_lora: true")
        tensors = {k.removeprefix(PEFT_PREFIX): v for k, v in load_file(str(directory / ADAPTER_WEIGHTS)).items()}
        self.fused = FusedDeltas(base, settings, tensors, self.scale, directory) \
            if settings.get("target_parameters") else None
        rename = self.fused.checkpoint_key if self.fused else (lambda key: key)
        self.pairs: dict[str, tuple] = {}  # base weight key -> (A, B)
        self.saved: dict[str, object] = {}  # base key -> a modules_to_save tensor
        self.magnitudes: dict[str, object] = {}  # DoRA: base key -> its trained magnitude (one per output row)
        for name, value in tensors.items():
            if name.endswith(".lora_magnitude_vector"):
                self.magnitudes[rename(name.removesuffix(".lora_magnitude_vector") + ".weight")] = value
            elif ".lora_A." in name:
                self.pairs.setdefault(rename(name.replace(".lora_A.", ".")), [None, None])[0] = value
            elif ".lora_B." in name:
                self.pairs.setdefault(rename(name.replace(".lora_B.", ".")), [None, None])[1] = value
            elif ".lora_embedding_" in name:
                raise ConfigError(f"{directory}: LoRA on an embedding ({name}) is not merged by export yet; set "
                                  f"output.merge_lora: true")
            else:  # modules_to_save: a full tensor that replaces the base's
                self.saved[rename(name.replace(".modules_to_save.", "."))] = value
        if half := next((k for k, (a, b) in self.pairs.items() if a is None or b is None), None):
            raise ConfigError(f"{directory}: the adapter holds one of lora_A/lora_B for {half} and not the other; "
                              f"the file is incomplete (save the adapter again)")

    def delta(self, key: str):
        a, b = self.pairs[key]
        d = (b.float() @ a.float()) * self.scale
        return d.T if self.fan_in_fan_out else d

    def merged(self, key: str, w):
        """The base weight ``key`` with its delta merged, in fp32: W + ΔW, and for DoRA (peft's merge) the result's
        rows rescaled to the trained magnitudes, m / ||W + ΔW|| (the norm over each output row's inputs)."""
        combined = w.float() + self.delta(key)
        if key not in self.magnitudes:
            return combined
        rows = combined.T if self.fan_in_fan_out else combined
        factor = (self.magnitudes[key].float() / rows.norm(dim=1)).view(-1, 1)
        return (factor * rows).T if self.fan_in_fan_out else factor * rows


def export_run(run_dir: str | Path, out: str | Path | None = None, dtype: str | None = None,
               base: str | Path | None = None) -> Exported:
    """Write the run's model as a standalone directory (see the module docstring). ``base``: the original-precision
    model to merge a LoRA adapter into, where the run trained on another copy (a pre-quantized checkpoint)."""
    run = RunDir(run_dir).require_run()
    final = run.final
    if not final.is_dir() or not any(final.iterdir()):
        raise ConfigError(f"{run.root}: no {RunDir.FINAL}/ (the run did not finish); export reads a finished run's "
                          f"model (scaletrain train --resume {run.root} finishes it)")
    if dtype is not None and dtype not in BYTES:
        raise ConfigError(f"--dtype {dtype}: choose {', '.join(BYTES)}")
    target = _target(out, run)
    if (final / ADAPTER_CONFIG).is_file():
        return _merge(run, final, target, dtype, Path(base).expanduser() if base else None)
    if base:
        raise ConfigError(f"--base {base}: {run.root} is a full fine-tune (no adapter to merge); remove --base")
    return _copy(final, target, dtype)


def base_dir(run: RunDir, final: Path) -> Path:
    """The directory of the base model a LoRA run trained from (as it recorded it)."""
    import yaml

    settings = json.loads((final / ADAPTER_CONFIG).read_text())
    recorded = settings.get("base_model_name_or_path") or ""
    if recorded and Path(recorded).is_dir():
        return Path(recorded)
    name = yaml.safe_load(run.resolved_config.read_text())["model"]["name_or_path"]
    try:
        path = model_dir(name)
    except ConfigError:
        path = None
    if path is None or not path.is_dir():
        raise ConfigError(f"{run.root}: the base model the run trained from is not where it recorded it "
                          f"({recorded or name}); put it back there, or link that path to it")
    return path


@contextmanager
def _written(target: Path):
    """A directory written beside ``target`` and renamed to it only when complete (removed on any failure): an
    export is never half there under its name."""
    partial = target.with_name(f".partial-{target.name}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        yield partial
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _release_freed_memory() -> None:
    """Hand the freed shard's memory back to the system (glibc's malloc keeps freed blocks under its mmap
    threshold, up to 32 MiB each, in the heap: without this the resident set grows shard after shard)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc's name (find_library would start ldconfig)
    except (OSError, AttributeError):  # not glibc: nothing to ask
        pass


def checkpoint_to_model_keys(base: Path):
    """A checkpoint's weight name -> the model's parameter name (what an adapter names). The same but where the
    checkpoint keeps an older layout that transformers renames as it loads (Qwen2-VL's ``model.layers.*`` is
    ``model.language_model.layers.*``, Gemma 3's ``language_model.model.*``): its own renamings, read from a model
    built on the meta device (no weights)."""
    if json.loads((base / "config.json").read_text()).get("vision_config") is None:  # a text model: no import
        return lambda key: key  # of transformers here (its ~100 MB would count against the export's memory)
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, apply_renamings

    config = AutoConfig.from_pretrained(str(base), local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
    return lambda key: apply_renamings(key, renamings)


def _merge(run: RunDir, final: Path, target: Path, dtype: str | None, given: Path | None = None) -> Exported:
    from safetensors import safe_open
    from safetensors.torch import save_file

    base = given or base_dir(run, final)
    if not (base / "config.json").is_file():
        raise ConfigError(f"--base {base}: not a model directory (no config.json)")
    quantized = (json.loads((base / "config.json").read_text()).get("quantization_config") or {}).get("quant_method")
    if quantized:  # a QLoRA run's own base is the original-precision model (quantized as it loads): this is not
        raise ConfigError(f"export: the base {base} is a pre-quantized ({quantized}) checkpoint; LoRA merges into "
                          f"the original-precision weights it was made from: export {run.root} --base DIR (that "
                          f"model's directory)")
    names = shards_of(base)
    dtype = dtype or _dtype_of(base)
    adapter = Adapter(final, base)
    size = sum((base / n).stat().st_size for n in names)
    _check_space(target, int(size * BYTES[dtype] / BYTES[_dtype_of(base)]))
    weight_map, total, merged, replaced = {}, 0, set(), set()
    model_key = checkpoint_to_model_keys(base)
    fused = adapter.fused.keys() if adapter.fused else set()
    with _written(target) as partial:
        for name in names:
            out = {}
            with safe_open(str(base / name), framework="pt") as f:
                for key in f.keys():  # written under the checkpoint's key; the adapter's names are the model's
                    w, mine = f.get_tensor(key), model_key(key)
                    if mine in adapter.saved:
                        w = adapter.saved[mine]
                        replaced.add(mine)
                    elif mine in adapter.pairs or mine in fused:
                        # added in fp32 and rounded once, to the dtype written (a bf16 base exported in fp32 keeps
                        # the adapter's fp32 precision)
                        w = adapter.merged(mine, w) if mine in adapter.pairs else w.float() + adapter.fused.delta(mine)
                        merged.add(mine)
                    out[key] = w.to(torch_dtype(dtype)).contiguous()
                    weight_map[key] = name
                    total += out[key].numel() * out[key].element_size()
            save_file(out, str(partial / name), metadata={"format": "pt"})
            del out
            _release_freed_memory()
        missing = sorted((set(adapter.pairs) | fused) - merged) + sorted(set(adapter.saved) - replaced)
        if missing:
            raise ConfigError(f"export: the adapter changes {len(missing)} weight(s) the base checkpoint {base} does "
                              f"not hold ({missing[0]} is the first); it was trained on another base")
        if len(names) > 1 or (base / INDEX).is_file():
            (partial / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                    indent=2) + "\n")
        _copy_beside([final, base], partial, dtype)
    return Exported(target, len(names), len(merged), len(replaced), dtype, total)


def _copy(final: Path, target: Path, dtype: str | None) -> Exported:
    """A full fine-tune's final/: its shards, cast shard by shard when another dtype is asked."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    names = shards_of(final)
    stored = _dtype_of(final)
    dtype = dtype or stored
    size = sum((final / n).stat().st_size for n in names)
    _check_space(target, int(size * BYTES[dtype] / BYTES[stored]))
    total = 0
    with _written(target) as partial:
        for name in names:
            if dtype == stored:
                shutil.copyfile(final / name, partial / name)
                total += (final / name).stat().st_size
                continue
            with safe_open(str(final / name), framework="pt") as f:
                out = {k: f.get_tensor(k).to(torch_dtype(dtype)).contiguous() for k in f.keys()}
            save_file(out, str(partial / name), metadata={"format": "pt"})
            total += sum(t.numel() * t.element_size() for t in out.values())
            del out
            _release_freed_memory()
        if (final / INDEX).is_file():
            index = json.loads((final / INDEX).read_text())
            index.setdefault("metadata", {})["total_size"] = total
            (partial / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        _copy_beside([final], partial, dtype)
    return Exported(target, len(names), 0, 0, dtype, total)

