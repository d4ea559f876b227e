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

    def prompt_ids(self, text: str) -> list[int]:
        """The ids of the conversation so far plus ``text``, as the trained template renders it for a reply."""
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + self.history + [
            {"role": "user", "content": text}]
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"]

    def reply(self, text: str, max_new_tokens: int = 256, temperature: float = 0.0, streamer=None) -> str:
        import torch

        ids = torch.tensor([self.prompt_ids(text)])
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=max_new_tokens, streamer=streamer,
                                      pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                                      **sampling)
        answer = self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        return answer


def open_chat(run_dir: str | Path, system: str | None = None) -> Chat:
    run = RunDir(run_dir).require_run()
    final = run.final
    if not final.is_dir() or not any(final.iterdir()):
        raise ConfigError(f"{run.root}: no {RunDir.FINAL}/ (the run did not finish); nothing to chat with yet")
    task = (yaml.safe_load(run.resolved_config.read_text()).get("model") or {}).get("task", "causal-lm")
    if task != "causal-lm":
        raise ConfigError(f"{run.root}: a {task} run; chat needs a causal language model")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(final))
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"{final}: its tokenizer has no chat template (a text-only run); chat has no turns to "
                          f"render")
    if (final / "adapter_config.json").is_file():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(str(final))
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(final))
    return Chat(model.eval(), tokenizer, system)
