"""`scaletrain chat`: the model answers through the template the run trained with (the prompt ids are the
template's render of the conversation so far), multi-turn keeps the history; a classification run is one line."""

import pytest

from scaletrain.after.chat import open_chat
from scaletrain.errors import ConfigError
from tests.unit.test_export import TEMPLATE, _base, _run


def test_chat_renders_the_trained_template_and_keeps_the_history(tmp_path, capsys):
    from scaletrain.cli import main

    run = _run(tmp_path, _base(tmp_path / "base"))
    chat = open_chat(run, system="Be brief.")
    ids = chat.prompt_ids("Hi?")
    assert chat.tokenizer.decode(ids) == "<|system|>Be brief.<|user|>Hi?"  # TEMPLATE's render, nothing else
    first = chat.reply("Hi?", max_new_tokens=4)
    assert isinstance(first, str) and [m["role"] for m in chat.history] == ["user", "assistant"]
    again = chat.tokenizer.decode(chat.prompt_ids("And?"))
    assert again.startswith("<|system|>Be brief.<|user|>Hi?<|assistant|>") and again.endswith("<|user|>And?")
    assert main(["chat", str(run), "--prompt", "Hi?", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.endswith("\n")
    assert TEMPLATE in (run / "final" / "tokenizer_config.json").read_text() or \
        (run / "final" / "chat_template.jinja").read_text() == TEMPLATE


def test_chat_on_a_classification_run_is_one_line(tmp_path):
    run = tmp_path / "cls"
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text("{}")
    (run / "config.resolved.yaml").write_text("model: {name_or_path: x, task: sequence-classification}\n")
    with pytest.raises(ConfigError, match="a sequence-classification run; chat needs a causal language model"):
        open_chat(run)
