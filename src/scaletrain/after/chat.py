"""`scaletrain chat RUN_DIR`: talk to a run's model through the chat template it trained with (final/'s tokenizer
carries it), in a terminal (multi-turn, tokens streamed) or for one ``--prompt``. Generation is transformers'
``generate`` (greedy unless a temperature is given); a LoRA run loads its adapter over its base with peft."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from scaletrain.errors import ConfigError
from scaletrain.rundir import RunDir


@dataclass
class Chat:
    model: object
    tokenizer: object
    system: str | None = None
    history: list[dict] = field(default_factory=list)
    image_text: object = None  # a vision-language model's (model/processor.py): replies about images
    images: list = field(default_factory=list)  # the conversation's images so far, in order
    bounds: tuple[int, int] = (768 * 768, 32 * 32)  # the run's data.image_max_pixels, data.image_min_pixels

    def prompt_ids(self, text: str) -> list[int]:
        """The ids of the conversation so far plus ``text``, as the trained template renders it for a reply."""
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + self.history + [
            {"role": "user", "content": text}]
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"]

    def reply(self, text: str, max_new_tokens: int = 256, temperature: float = 0.0, streamer=None,
              images: list | None = None) -> str:
        """The model's answer to ``text`` (about ``images``, decoded: each an ``<image>`` before the text)."""
        import torch

        images = list(images or [])
        if images and self.image_text is None:
            raise ConfigError("chat --image: this run's model is a text model; it cannot read images")
        text = "<image>" * len(images) + text
        if self.image_text is not None:
            from scaletrain.data.vision import prompt_inputs

            messages = ([{"role": "system", "content": self.system}] if self.system else []) + self.history + [
                {"role": "user", "content": text}]
            inputs = prompt_inputs(messages, self.tokenizer, self.image_text, self.images + images)
        else:
            ids = torch.tensor([self.prompt_ids(text)])
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.no_grad():
            out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, streamer=streamer,
                                      pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                                      **sampling)
        answer = self.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        self.images += images
        return answer


def read_image(path: str, bounds: tuple[int, int]) -> object:
    """An image file for ``chat --image``, bounded as the run's data step bounded its images: ``bounds`` is the
    run's (data.image_max_pixels, data.image_min_pixels)."""
    from scaletrain.data.images import ImageProblem, open_image, read_bytes

    try:
        return open_image(read_bytes(path), path, *bounds)
    except ImageProblem as e:
        raise ConfigError(f"chat --image {path}: {e}") from None


def open_chat(run_dir: str | Path, system: str | None = None) -> Chat:
    run = RunDir(run_dir).require_run()
    final = run.final
    if not final.is_dir() or not any(final.iterdir()):
        raise ConfigError(f"{run.root}: no {RunDir.FINAL}/ (the run did not finish); nothing to chat with yet")
    resolved = yaml.safe_load(run.resolved_config.read_text())
    task = (resolved.get("model") or {}).get("task", "causal-lm")
    if task != "causal-lm":
        raise ConfigError(f"{run.root}: a {task} run; chat needs a causal language model")
    from transformers import AutoConfig, AutoTokenizer

    from scaletrain.model.vision import is_vision_language

    tokenizer = AutoTokenizer.from_pretrained(str(final))
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"{final}: its tokenizer has no chat template (a text-only run); chat has no turns to "
                          f"render")
    lora = (final / "adapter_config.json").is_file()
    base = _adapter_base(final) if lora else final
    config = AutoConfig.from_pretrained(str(base))
    image_text = None
    if is_vision_language(config):  # images and text in: the image-text-to-text class and the run's processor
        from peft import PeftModel
        from transformers import AutoModelForImageTextToText

        from scaletrain.model.processor import image_text as reader

        model = AutoModelForImageTextToText.from_pretrained(str(base))
        model = PeftModel.from_pretrained(model, str(final)) if lora else model
        image_text = reader(str(final if (final / "preprocessor_config.json").is_file() else base), config,
                            tokenizer)
    elif lora:
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(str(final))
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(final))
    data = resolved.get("data") or {}
    bounds = (data.get("image_max_pixels", 768 * 768), data.get("image_min_pixels", 32 * 32))
    return Chat(model.eval(), tokenizer, system, image_text=image_text, bounds=bounds)


def _adapter_base(final: Path) -> Path:
    """The base directory a LoRA run's adapter names."""
    import json

    return Path(json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"])
