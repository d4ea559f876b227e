"""Multi-turn tool conversations with Qwen3's own chat template (its history rules), for real: a tiny Llama saved
in bf16 whose tokenizer carries Qwen3-4B-Thinking-2507's released template, LoRA on 2 workers (torchrun, as the
CLI runs it); the run trains every assistant turn, its final/ keeps the template and generates with it."""

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from tests.cli import run_cli
from tests.conftest import write_config

pytestmark = pytest.mark.slow

QWEN3 = (Path(__file__).parents[1] / "fixtures" / "chat_templates" / "qwen3_4b_thinking_2507.jinja").read_text()
WEATHER = {"name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _record(i: int) -> dict:
    city = ["Paris", "Rome", "Oslo", "Lima"][i % 4]
    return {"tools": json.dumps([WEATHER]), "messages": [
        {"role": "user", "content": f"Weather in {city}?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}]},
        {"role": "tool", "content": json.dumps({"temp_c": 10 + i % 20})},
        {"role": "assistant", "content": f"{10 + i % 20} C in {city}.", "reasoning_content": "The tool said."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "<think>\nBe polite.\n</think>\n\nYou are welcome."}]}


@pytest.fixture(scope="module")
def qwen3_style_model(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    d = tmp_path_factory.mktemp("ckpt") / "tiny-qwen3-template"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=128)).to(torch.bfloat16).save_pretrained(d)
    tok = tiny_llama_tokenizer()
    tok.chat_template = QWEN3
    tok.save_pretrained(d)
    return d


def test_two_workers_train_qwen3_tool_conversations_and_final_generates_with_the_template(
        tmp_path, qwen3_style_model):
    data = tmp_path / "tools.jsonl"
    data.write_text("\n".join(json.dumps(_record(i)) for i in range(64)))
    cfg = {"model": {"name_or_path": str(qwen3_style_model), "task": "causal-lm", "finetuning_type": "lora",
                     "lora_rank": 4, "lora_alpha": 8},
           "data": {"train_file": str(data), "formatting": "messages", "template": "auto", "max_length": 768,
                    "eval_ratio": 0.1},
           "train": {"per_device_train_batch_size": 4, "max_steps": 6, "learning_rate": 5e-3, "logging_steps": 2},
           "scaling": {"num_workers": 2},
           "output": {"output_dir": str(tmp_path / "runs"), "run_name": "q3"}}
    out = run_cli("train", write_config(tmp_path / "c.yaml", cfg), "--no-progress",
                  env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "runs" / "q3"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["world_size"] == 2
    log = (run / "logs" / "main.log").read_text()
    assert "multi_turn=spans: every assistant turn of the whole conversation" in log
    # main.log's first example: the tool call, the answer after the tool result and the last reply are trained
    # (the reasoning of the turn before the last query dropped, as the template writes it), no user/tool text
    first = log.split("first example: ", 1)[1]
    assert "[[<tool_call>\n" in first and "C in " in first and "Be polite.\n</think>\n\nYou are welcome." in first
    assert "[[Weather in" not in first and "The tool said" not in first
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    final = run / "final"
    tokenizer = AutoTokenizer.from_pretrained(str(final))
    assert tokenizer.chat_template == QWEN3  # final/ keeps the template it trained with
    model = AutoPeftModelForCausalLM.from_pretrained(str(final))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert tokenizer.decode(prompt["input_ids"][0]).endswith("<|im_start|>assistant\n<think>\n")
    generated = model.generate(**prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 4
    saved = yaml.safe_load((run / "config.resolved.yaml").read_text())
    assert saved["data"]["multi_turn"] == "spans"
