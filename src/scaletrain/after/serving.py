"""`scaletrain serve RUN_DIR --print vllm|sglang`: the command that serves a run's model, with the prompt format it
trained with.

A LoRA adapter is served beside its base (vLLM: ``--enable-lora --lora-modules NAME=DIR --max-lora-rank R``, R the
smallest rank vLLM accepts at or above the adapter's; SGLang: ``--lora-paths``); an adapter a server cannot load
(``modules_to_save``, LoRA on embeddings or fused expert parameters, a rank above the server's largest) is served
as the merged export instead, and the command says so. Both servers render prompts with the *base* tokenizer's
template unless told otherwise, so the command passes the template the run trained with (``final/``'s), after
checking it against the built-in the run named, and that the saved tokenizer gives the run's own tokenized prompts
the ids training gave them (decoded and encoded again: a tokenizer check, not a re-render of the records).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from scaletrain.errors import ConfigError
from scaletrain.rundir import RunDir

# vLLM's LoRAConfig.max_lora_rank choices (vllm/config/lora.py, MaxLoRARanks); its default is 16.
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
SERVERS = ("vllm", "sglang")
TEMPLATE_FILE = "chat_template.jinja"


@dataclass(frozen=True)
class Plan:
    commands: list[str]
    notes: list[str]


def _adapter_blockers(settings: dict, tensors: list[str]) -> list[str]:
    """Why a server cannot load this adapter as an adapter (empty: it can)."""
    why = []
    if settings.get("modules_to_save"):
        why.append(f"modules_to_save ({', '.join(settings['modules_to_save'])}) retrains whole modules")
    if any("lora_embedding" in t for t in tensors) or any(
            m in (settings.get("target_modules") or []) for m in ("embed_tokens", "lm_head")):
        why.append("LoRA on the embedding or output layer")
    if settings.get("target_parameters"):
        why.append("LoRA on fused parameters (an MoE's experts)")
    if settings.get("use_dora"):
        why.append("a DoRA adapter")
    if settings.get("r", 0) > VLLM_RANKS[-1]:
        why.append(f"rank {settings['r']} above the servers' largest ({VLLM_RANKS[-1]})")
    return why


def serve_plan(run_dir: str | Path, server: str, name: str | None = None) -> Plan:
    if server not in SERVERS:
        raise ConfigError(f"--print {server}: choose {', '.join(SERVERS)}")
    run = RunDir(run_dir).require_run()
    final = run.final
    if not final.is_dir() or not any(final.iterdir()):
        raise ConfigError(f"{run.root}: no {RunDir.FINAL}/ (the run did not finish); nothing to serve yet")
    cfg = yaml.safe_load(run.resolved_config.read_text())
    if cfg.get("model", {}).get("task", "causal-lm") != "causal-lm":
        raise ConfigError(f"{run.root}: a {cfg['model']['task']} run; vLLM and SGLang serve causal language models")
    name = name or run.name
    template = check_template(run)
    notes = [f"the chat template the run trained with: {template} (checked against the run's own prompts)"]
    q = shlex.quote
    adapter = final / "adapter_config.json"
    images = _image_settings(run, cfg, server, notes)  # a vision-language run's multimodal flags ("" for text)
    if not adapter.is_file():
        model = q(str(final))
        cmd = (f"vllm serve {model} --served-model-name {q(name)} --chat-template {q(str(template))}{images}"
               if server == "vllm" else
               f"python -m sglang.launch_server --model-path {model} --served-model-name {q(name)} "
               f"--chat-template {q(str(template))}")
        return Plan([cmd], notes)
    from safetensors import safe_open

    settings = json.loads(adapter.read_text())
    with safe_open(str(final / "adapter_model.safetensors"), framework="pt") as f:
        tensors = list(f.keys())
    base = settings.get("base_model_name_or_path") or cfg["model"]["name_or_path"]
    if blockers := _adapter_blockers(settings, tensors):
        merged = run.root / "export"
        notes.append(f"served merged, not as an adapter: {'; '.join(blockers)}")
        serve = (f"vllm serve {q(str(merged))} --served-model-name {q(name)}{images}" if server == "vllm" else
                 f"python -m sglang.launch_server --model-path {q(str(merged))} --served-model-name {q(name)}")
        return Plan([f"scaletrain export {q(str(run.root))} -o {q(str(merged))}", serve], notes)
    rank = settings["r"]
    max_rank = next(r for r in VLLM_RANKS if r >= rank)
    if max_rank > 16:
        notes.append(f"rank {rank}: --max-lora-rank {max_rank} (vLLM's default, 16, would refuse the adapter)")
    if server == "vllm":
        cmd = (f"vllm serve {q(base)} --enable-lora --lora-modules {q(f'{name}={final}')} --max-lora-rank "
               f"{max_rank} --chat-template {q(str(template))}{images}")
    else:
        cmd = (f"python -m sglang.launch_server --model-path {q(base)} --enable-lora --lora-paths "
               f"{q(f'{name}={final}')} --max-lora-rank {max_rank} --chat-template {q(str(template))}")
    notes.append(f"requests name the adapter as the model: \"model\": \"{name}\"")
    return Plan([cmd], notes)


def _image_settings(run: RunDir, cfg: dict, server: str, notes: list[str]) -> str:
    """vLLM's multimodal flags for a vision-language run: as many images per prompt as the training data had in
    one record (``--limit-mm-per-prompt``), and Qwen-VL's pixel bounds as the run's data step bounded them
    (``--mm-processor-kwargs``); "" for a text run."""
    from transformers import AutoConfig

    from scaletrain.model.processor import QWEN_TYPES
    from scaletrain.model.vision import is_vision_language

    final = run.final
    where = final if (final / "config.json").is_file() else Path(cfg["model"]["name_or_path"])
    try:
        config = AutoConfig.from_pretrained(str(where), local_files_only=True)
    except (OSError, ValueError):
        return ""
    if not is_vision_language(config):
        return ""
    most = _most_images(run)
    data = cfg.get("data") or {}
    bounds = {"max_pixels": data.get("image_max_pixels", 768 * 768), "min_pixels": data.get("image_min_pixels", 1024)}
    if server != "vllm":
        notes.append(f"a vision-language model: SGLang reads its images with the model's processor; the run bounded "
                     f"them to {bounds['min_pixels']}..{bounds['max_pixels']} pixels")
        return ""
    flags = f" --limit-mm-per-prompt {shlex.quote(json.dumps({'image': most}))}"
    if config.model_type in QWEN_TYPES:
        flags += f" --mm-processor-kwargs {shlex.quote(json.dumps(bounds))}"
    notes.append(f"a vision-language model: up to {most} image(s) a prompt (the most a training row had)"
                 + (", bounded to the run's image_min/max_pixels" if config.model_type in QWEN_TYPES else ""))
    return flags


def _most_images(run: RunDir) -> int:
    """The most images one training row had (the run's prepared data), at least 1."""
    try:
        import datasets

        train = json.loads((run.data / "source.json").read_text())["train"]
        counts = datasets.load_from_disk(train).select_columns(["image_tokens"])["image_tokens"]
        return max([len(c) for c in counts] + [1])
    except (OSError, KeyError, ValueError):
        return 1


def check_template(run: RunDir, prompts: int = 100) -> Path:
    """The file of final/'s chat template, written when the tokenizer keeps it in tokenizer_config.json, after
    checking that it renders up to ``prompts`` of the run's own examples to the ids training gave them."""
    from transformers import AutoTokenizer

    final = run.final
    tokenizer = AutoTokenizer.from_pretrained(str(final))
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise ConfigError(f"{final}: its tokenizer has no chat template; the run wrote none (a text-only run): "
                          f"give the server the template the prompts should use")
    cfg = yaml.safe_load(run.resolved_config.read_text())
    trained = cfg.get("data", {}).get("template", "auto")
    from scaletrain.data.templates import BUILTIN_TEMPLATES

    if trained in BUILTIN_TEMPLATES and BUILTIN_TEMPLATES[trained] != template:
        raise ConfigError(f"{final}: its tokenizer's chat template is not the built-in data.template={trained} the run "
                          f"trained with; the served prompts would differ from the trained ones")
    path = final / TEMPLATE_FILE
    if not path.is_file():
        path.write_text(template)
    elif path.read_text() != template:
        raise ConfigError(f"{path} differs from the template in {final}'s tokenizer_config.json; remove one of them")
    _same_ids(run, tokenizer, prompts)
    return path


def _same_ids(run: RunDir, tokenizer, prompts: int) -> None:
    """The saved tokenizer gives the ids training gave for the prompt part (up to the first label) of the run's
    first ``prompts`` training examples, decoded and encoded again (when the run's tokenized data is still there)."""
    data = run.data / "train"
    if not data.is_dir():
        return
    import datasets

    ds = datasets.load_from_disk(str(data))
    if "labels" not in ds.column_names:
        return
    for i in range(min(prompts, len(ds))):
        ids, labels = ds[i]["input_ids"], ds[i]["labels"]
        first = next((k for k, lab in enumerate(labels) if lab != -100), len(ids))
        text = tokenizer.decode(ids[:first])
        again = tokenizer(text, add_special_tokens=False)["input_ids"]
        if again != list(ids[:first]):
            raise ConfigError(f"{run.final}: its tokenizer gives other ids than training did for the run's example "
                              f"{i + 1}; the served prompts would differ from the trained ones")
