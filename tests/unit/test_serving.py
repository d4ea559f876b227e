"""`scaletrain serve --print vllm|sglang`: the adapter beside its base with the rank the server needs and the
template the run trained with, the merged export where a server cannot load the adapter, a full fine-tune as
itself; a template that is not the trained one, or a classification run, is one line."""

import json

import pytest
import yaml

from scaletrain.after.serving import serve_plan
from scaletrain.errors import ConfigError
from tests.unit.test_export import TEMPLATE, _base, _run


def test_an_adapter_is_served_beside_its_base_with_the_trained_template(tmp_path, capsys):
    from scaletrain.cli import main

    base = _base(tmp_path / "base")
    run = _run(tmp_path, base)
    plan = serve_plan(run, "vllm")
    final = run / "final"
    assert plan.commands == [f"vllm serve {base} --enable-lora --lora-modules run={final} --max-lora-rank 8 "
                             f"--chat-template {final}/chat_template.jinja"]
    assert (final / "chat_template.jinja").read_text() == TEMPLATE
    sglang = serve_plan(run, "sglang", name="mine").commands[0]
    assert sglang.startswith(f"python -m sglang.launch_server --model-path {base} --enable-lora --lora-paths "
                             f"mine={final} --max-lora-rank 8")
    settings = json.loads((final / "adapter_config.json").read_text())
    settings["r"] = 24  # vLLM accepts 32 at or above it; its default 16 would refuse it
    (final / "adapter_config.json").write_text(json.dumps(settings))
    plan = serve_plan(run, "vllm")
    assert "--max-lora-rank 32" in plan.commands[0] and any("default, 16, would refuse" in n for n in plan.notes)
    assert main(["serve", str(run), "--print", "vllm"]) == 0
    assert capsys.readouterr().out.startswith(f"vllm serve {base} --enable-lora")


def test_what_a_server_cannot_load_is_served_merged(tmp_path):
    run = _run(tmp_path, _base(tmp_path / "base"), save=["lm_head"])
    plan = serve_plan(run, "vllm")
    assert plan.commands == [f"scaletrain export {run} -o {run}/export",
                             f"vllm serve {run}/export --served-model-name run"]
    assert any("modules_to_save (lm_head)" in n for n in plan.notes)


def test_a_full_fine_tune_serves_itself_and_the_bad_inputs_are_one_line(tmp_path):
    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    run = tmp_path / "full"
    _base(run / "final")
    tok = tiny_llama_tokenizer()
    tok.chat_template = TEMPLATE
    tok.save_pretrained(run / "final")
    (run / "config.resolved.yaml").write_text("model: {name_or_path: x}\n")
    assert serve_plan(run, "vllm").commands[0].startswith(f"vllm serve {run}/final --served-model-name full")
    (run / "config.resolved.yaml").write_text(yaml.safe_dump({"model": {"name_or_path": "x"},
                                                               "data": {"template": "chatml"}}))
    with pytest.raises(ConfigError, match="not the built-in data.template=chatml the run trained with"):
        serve_plan(run, "vllm")
    (run / "config.resolved.yaml").write_text("model: {name_or_path: x, task: sequence-classification}\n")
    with pytest.raises(ConfigError, match="a sequence-classification run; vLLM and SGLang serve causal"):
        serve_plan(run, "vllm")
