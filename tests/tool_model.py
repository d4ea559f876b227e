"""A tiny model that calls tools, for the runs of #74's multi-turn rollouts: a random tiny Llama whose tokenizer
carries Qwen3's released chat template (its end of turn the end of sequence, as Qwen3's tokenizer has it), with each
tool call the tests' tools answer one added token (the call as the template writes it), and an output layer that
favours a handful of tokens (the calls, the end of turn, two words): the model samples those, from its own random
streams, so a few tokens in most completions have called a tool, some twice, some with arguments the tool refuses.
Nothing is trained to get there: the calls are what a random policy over that handful gives."""

from __future__ import annotations

from pathlib import Path

QWEN3 = Path(__file__).parent / "fixtures" / "chat_templates" / "qwen3_0_6b.jinja"

CALLS = ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
         '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>',  # b missing: the tool raises
         '<tool_call>\n{"name": "guess", "arguments": {"n": 4}}\n</tool_call>')

TOOLS = '''
def add(a: int, b: int) -> int:
    """Adds two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def vowels(prompts, completions, **kwargs):
    """The share of vowels in the completion's last turn: partial credit a random policy earns."""
    texts = [c[-1]["content"] for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(1, len(t)) for t in texts]


class Counter:
    """Knows the row's answer, counts the guesses, and scores the last one."""

    def reset(self, answer=None, **row):
        self.answer, self.guesses, self.last = int(answer), 0, None

    def guess(self, n: int) -> str:
        """Guesses the answer.

        Args:
            n: The guess.
        """
        self.guesses += 1
        self.last = n
        return "higher" if n < self.answer else "lower" if n > self.answer else "right"

    def get_reward(self) -> float:
        return 1.0 if self.last == self.answer else 0.0
'''


def tool_caller(d: Path) -> Path:
    """The model directory (and its tools.py) at ``d``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    tok = tiny_llama_tokenizer()
    tok.chat_template = QWEN3.read_text()
    tok.eos_token = "<|im_end|>"
    tok.add_tokens(list(CALLS))
    kept = tok.convert_tokens_to_ids(list(CALLS)) + [tok.eos_token_id] + [
        tok(w, add_special_tokens=False)["input_ids"][0] for w in ("ok", " yes")]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                                         max_position_embeddings=4096, tie_word_embeddings=False))
    with torch.no_grad():  # every token's embedding carries a constant first dimension, which after the final
        # norm is ~8 at every position; the kept tokens' output rows read it: a logit of ~10 for each of them, ~0
        # for every other token (98% of the mass on the kept ones, near uniform among them)
        model.model.embed_tokens.weight[:, 0] = 10.0
        model.lm_head.weight[kept, 0] = 1.25
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    (d / "tools.py").write_text(TOOLS)
    return d
