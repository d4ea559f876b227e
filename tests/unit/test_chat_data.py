"""Chat data as users bring it: formats, chat templates (byte for byte against apply_chat_template), loss masks,
truncation, the cache, several datasets, and every bad input as one error naming the key and the fix."""

import json
from pathlib import Path

import pytest

from scaletrain.config import validate
from scaletrain.data import IGNORE_INDEX, prepare_data
from scaletrain.data.encode import budget, fit
from scaletrain.data.templates import BUILTIN_TEMPLATES, render
from scaletrain.errors import ConfigError, DataError
from scaletrain.model.tokenizer import load_tokenizer

# A Qwen-style template written the way model repos ship them: no {% generation %} marks, a default system
# prompt, the end-of-turn token and a newline after every turn.
OWN_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

CHAT = [{"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Opposite of hot?"}, {"role": "assistant", "content": "Cold."},
        {"role": "user", "content": "And of fast?\nBe brief."}, {"role": "assistant", "content": "Slow."}]


@pytest.fixture(scope="module")
def own_tokenizer(tmp_path_factory):
    """A local tokenizer directory whose config carries its own chat template (as a downloaded model's does)."""
    from transformers import AutoTokenizer

    d = tmp_path_factory.mktemp("tok")
    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = OWN_TEMPLATE
    tok.save_pretrained(str(d))
    return AutoTokenizer.from_pretrained(str(d), local_files_only=True)


@pytest.fixture(scope="module")
def tiny():
    return load_tokenizer("builtin:tiny-llama")


def _cfg(tmp_path, data, task="causal-lm"):
    return validate({"model": {"name_or_path": "builtin:tiny-llama", "task": task},
                     "data": {"eval_ratio": 0.0, "max_length": 256, **data},
                     "output": {"output_dir": str(tmp_path / "runs")}})


def _write(path: Path, rows) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _sharegpt(chat):
    tags = {"system": "system", "user": "human", "assistant": "gpt"}
    return {"conversations": [{"from": tags[m["role"]], "value": m["content"]} for m in chat]}


def _decoded_labels(tok, ex) -> list[str]:
    """The text of each run of trained tokens."""
    runs, cur = [], []
    for t, label in zip(ex["input_ids"], ex["labels"]):
        if label != IGNORE_INDEX:
            cur.append(t)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    return runs + ([tok.decode(cur)] if cur else [])


def test_input_ids_equal_apply_chat_template_and_labels_cover_the_assistant_turns(tmp_path, own_tokenizer):
    path = _write(tmp_path / "chat.jsonl", [_sharegpt(CHAT)])
    data = prepare_data(_cfg(tmp_path, {"train_file": str(path), "formatting": "sharegpt"}), own_tokenizer)
    ex = data.train[0]
    ref = own_tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=True)["input_ids"]
    assert ex["input_ids"] == ref  # byte for byte: the template's own text, tokenized as transformers does
    # the end-of-turn token is the last a model writes: the template's line break after it is no label (#60)
    assert _decoded_labels(own_tokenizer, ex) == ["Cold.<|im_end|>", "Slow.<|im_end|>"]


def test_messages_format_and_the_default_system_prompt(tmp_path, own_tokenizer):
    path = _write(tmp_path / "m.jsonl", [{"messages": CHAT[1:]}])
    ex = prepare_data(_cfg(tmp_path, {"train_file": str(path), "formatting": "messages"}), own_tokenizer).train[0]
    assert ex["input_ids"] == own_tokenizer.apply_chat_template(CHAT[1:], tokenize=True, return_dict=True)["input_ids"]
    assert "You are a helpful assistant." in own_tokenizer.decode(ex["input_ids"])


@pytest.mark.parametrize("name,expected", [
    ("alpaca", "Answer in one word.\n\n### Instruction:\nOpposite of hot?\n\n### Response:\nCold.</s>\n\n"
               "### Instruction:\nAnd of fast?\nBe brief.\n\n### Response:\nSlow.</s>"),
    ("chatml", "<|im_start|>system\nAnswer in one word.<|im_end|>\n<|im_start|>user\nOpposite of hot?<|im_end|>\n"
               "<|im_start|>assistant\nCold.<|im_end|>\n<|im_start|>user\nAnd of fast?\nBe brief.<|im_end|>\n"
               "<|im_start|>assistant\nSlow.<|im_end|>\n"),
    ("llama3", "<s><|start_header_id|>system<|end_header_id|>\n\nAnswer in one word.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nOpposite of hot?<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\nCold.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nAnd of fast?\nBe brief.<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\nSlow.<|eot_id|>"),
    ("mistral_v1", "<s>[INST] Answer in one word.\n\nOpposite of hot? [/INST]Cold.</s>[INST] And of fast?\nBe "
                   "brief. [/INST]Slow.</s>"),
    ("mistral", "<s>[INST] Opposite of hot?[/INST] Cold.</s>[INST] Answer in one word.\n\nAnd of fast?\nBe brief."
                "[/INST] Slow.</s>"),
    ("gemma", "<s><start_of_turn>user\nAnswer in one word.\n\nOpposite of hot?<end_of_turn>\n<start_of_turn>model\n"
              "Cold.<end_of_turn>\n<start_of_turn>user\nAnd of fast?\nBe brief.<end_of_turn>\n<start_of_turn>model\n"
              "Slow.<end_of_turn>\n"),
    ("vicuna", "Answer in one word. USER: Opposite of hot? ASSISTANT: Cold.</s>USER: And of fast?\nBe brief. "
               "ASSISTANT: Slow.</s>"),
])
def test_each_builtin_template_renders_its_documented_string(name, expected, tiny):
    (text,), (spans,) = render([CHAT], BUILTIN_TEMPLATES[name], {"bos_token": "<s>", "eos_token": "</s>"}, name)
    assert text == expected
    # the replies are the spans (with the space Mistral's [/INST] is followed by), EOS/end of turn too
    assert [text[a:b] for a, b in spans][0].lstrip().startswith("Cold.")
    assert len(spans) == 2 and text[spans[1][0]:spans[1][1]].lstrip().startswith("Slow.")


def test_the_eos_the_template_emits_is_a_label(tmp_path, tiny):
    path = _write(tmp_path / "a.jsonl", [{"instruction": "Opposite of hot?", "output": "cold"}])
    ex = prepare_data(_cfg(tmp_path, {"train_file": str(path), "template": "alpaca"}), tiny).train[0]
    assert ex["labels"][-1] == tiny.eos_token_id == ex["input_ids"][-1]
    assert _decoded_labels(tiny, ex) == ["cold</s>"]


def test_alpaca_system_and_history_become_turns(tmp_path, tiny):
    row = {"instruction": "And of fast?", "input": "", "output": "Slow.", "system": "Be terse.",
           "history": [["Opposite of hot?", "Cold."]]}
    path = _write(tmp_path / "a.jsonl", [row])
    ex = prepare_data(_cfg(tmp_path, {"train_file": str(path), "template": "chatml"}), tiny).train[0]
    text = tiny.decode(ex["input_ids"])
    assert text.startswith("<|im_start|>system\nBe terse.<|im_end|>") and text.count("<|im_start|>assistant") == 2
    assert _decoded_labels(tiny, ex) == ["Cold.<|im_end|>", "Slow.<|im_end|>"]


def test_mask_history_and_train_on_prompt(tmp_path, tiny):
    path = _write(tmp_path / "s.jsonl", [_sharegpt(CHAT)])
    base = {"train_file": str(path), "formatting": "sharegpt", "template": "chatml"}
    last = prepare_data(_cfg(tmp_path, {**base, "mask_history": True}), tiny).train[0]
    assert _decoded_labels(tiny, last) == ["Slow.<|im_end|>"]
    every = prepare_data(_cfg(tmp_path, {**base, "train_on_prompt": True}), tiny).train[0]
    assert every["labels"] == every["input_ids"]


def test_bad_conversations_are_skipped_counted_and_named(tmp_path, tiny):
    good = [_sharegpt(CHAT)] * 198
    bad = [{"conversations": [{"from": "gpt", "value": "I speak first"}, {"from": "human", "value": "?"}]},
           {"conversations": [{"from": "human", "value": "hi"}, {"from": "robot", "value": "beep"}]}]
    path = _write(tmp_path / "s.jsonl", good[:50] + bad[:1] + good[50:] + bad[1:])
    data = prepare_data(_cfg(tmp_path, {"train_file": str(path), "formatting": "sharegpt", "template": "chatml"}), tiny)
    assert len(data.train) == 198
    notes = " ".join(data.notes)
    assert "(line 51)" in notes and "out of order" in notes
    assert "(line 200)" in notes and "unknown role 'robot'" in notes
    assert sum(data.skipped.values()) == 2
    with pytest.raises(DataError, match=r"s.jsonl: 2 of 200 records cannot be trained on .*max_bad_ratio=0.005.*"
                                        r"line 51: turn 0 \(gpt\) is out of order"):
        prepare_data(_cfg(tmp_path, {"train_file": str(path), "formatting": "sharegpt", "template": "chatml",
                                     "max_bad_ratio": 0.005, "overwrite_cache": True}), tiny)


def test_truncation_cuts_the_prompt_first_and_drops_what_has_nothing_to_learn(tmp_path, tiny):
    assert budget(source=300, target=20, cutoff=100) == (80, 20)  # a short reply is kept whole
    assert budget(source=30, target=300, cutoff=100) == (30, 70)  # a short prompt is kept whole
    assert budget(source=300, target=300, cutoff=100) == (50, 50)
    ids, mask = fit(list(range(10)), [0] * 6 + [1] * 4, cutoff=6)
    assert ids == [0, 1, 2, 3, 6, 7] and mask == [0, 0, 0, 0, 1, 1]  # the reply keeps its share (4 of 10 -> 2 of 6)
    long_prompt = "word " * 400
    rows = [{"instruction": long_prompt, "output": "fine"}, {"instruction": "short", "output": "ok"}]
    path = _write(tmp_path / "a.jsonl", rows)
    data = prepare_data(_cfg(tmp_path, {"train_file": str(path), "max_length": 64, "template": "alpaca",
                                        "max_truncated_ratio": 1, "max_bad_ratio": 1.0}), tiny)
    assert len(data.train) == 2 and all(len(ex["input_ids"]) <= 64 for ex in data.train)
    assert all(_decoded_labels(tiny, ex)[-1].endswith("</s>") for ex in data.train)  # the reply survived the cut


def test_max_samples_caps_the_file_before_the_eval_split(tmp_path, tiny):
    path = _write(tmp_path / "a.jsonl", [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(100)])
    data = prepare_data(_cfg(tmp_path, {"train_file": str(path), "max_samples": 20, "eval_ratio": 0.25}), tiny)
    assert (len(data.train), len(data.eval)) == (15, 5)


def test_text_formatting_trains_on_every_token(tmp_path, tiny):
    path = _write(tmp_path / "t.jsonl", [{"text": "Once upon a time."}, {"text": ""}] + [{"text": "x y"}] * 200)
    data = prepare_data(_cfg(tmp_path, {"train_file": str(path), "formatting": "text"}), tiny)
    ex = data.train[0]
    assert ex["labels"] == ex["input_ids"] and ex["input_ids"][-1] == tiny.eos_token_id and len(data.train) == 201


def test_cache_hit_on_the_second_run_and_miss_after_a_change(tmp_path, tiny):
    path = _write(tmp_path / "a.jsonl", [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(30)])
    cfg = _cfg(tmp_path, {"train_file": str(path), "template": "alpaca"})
    first = prepare_data(cfg, tiny)
    second = prepare_data(cfg, tiny)
    assert not first.cached and second.cached and "cache hit" in second.notes[0]
    assert second.train.to_list() == first.train.to_list() and second.train_path == first.train_path
    chatml = prepare_data(_cfg(tmp_path, {"train_file": str(path), "template": "chatml"}), tiny)
    assert not chatml.cached and chatml.train_path != first.train_path  # another template: tokenized again
    _write(path, [{"instruction": f"q{i}", "output": f"b{i}"} for i in range(30)])
    changed = prepare_data(cfg, tiny)
    assert not changed.cached and changed.train_path != first.train_path  # another file content
    forced = prepare_data(_cfg(tmp_path, {"train_file": str(path), "template": "alpaca", "overwrite_cache": True}),
                          tiny)
    assert not forced.cached and forced.train.to_list() == changed.train.to_list()


def _dataset_dir(tmp_path: Path) -> Path:
    d = tmp_path / "lf-data"
    d.mkdir()
    _write(d / "alpaca_demo.jsonl", [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(40)])
    _write(d / "chat_demo.jsonl", [{"messages": [{"role": "user", "content": f"hi {i}"},
                                                 {"role": "assistant", "content": f"hello {i}"}]} for i in range(20)])
    (d / "dataset_info.json").write_text(json.dumps({
        "alpaca_demo": {"file_name": "alpaca_demo.jsonl"},
        "chat_demo": {"file_name": "chat_demo.jsonl", "formatting": "sharegpt",
                      "columns": {"messages": "messages"},
                      "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                               "assistant_tag": "assistant"}},
        "hub_only": {"hf_hub_url": "someone/data"}}))
    return d


def test_several_datasets_from_dataset_info_concat_and_interleave(tmp_path, tiny):
    d = _dataset_dir(tmp_path)
    both = {"dataset_dir": str(d), "dataset": "alpaca_demo,chat_demo", "template": "chatml"}
    concat = prepare_data(_cfg(tmp_path, both), tiny)
    assert len(concat.train) == 60
    mixed = {**both, "mix_strategy": "interleave", "mix_probs": [0.5, 0.5]}
    a, b = prepare_data(_cfg(tmp_path, mixed), tiny), prepare_data(_cfg(tmp_path, {**mixed, "overwrite_cache": True}),
                                                                  tiny)
    assert a.train.to_list() == b.train.to_list()  # seeded: the same mix on every run
    texts = [tiny.decode(ex["input_ids"]) for ex in a.train]
    assert any("hello" in t for t in texts) and any("q1" in t for t in texts)
    with pytest.raises(DataError,
                       match=r"data.dataset: chat_dem is not in .*dataset_info.json; did you mean chat_demo"):
        prepare_data(_cfg(tmp_path, {**both, "dataset": ["chat_dem"]}), tiny)
    with pytest.raises(DataError, match=r"hub_only.*hf_hub_url; scaletrain never downloads"):
        prepare_data(_cfg(tmp_path, {**both, "dataset": ["hub_only"]}), tiny)


def test_bad_input_is_one_line_naming_the_key_and_the_fix(tmp_path, tiny):
    chat = _write(tmp_path / "chat.jsonl", [_sharegpt(CHAT)] * 4)
    alpaca = _write(tmp_path / "a.jsonl", [{"instruction": "q", "output": "a"}] * 4)
    cases = [
        ({"train_file": str(alpaca), "template": "chatmll"}, ConfigError,
         r"data.template=chatmll is not a template: did you mean chatml"),
        ({"train_file": str(chat)}, DataError, r"the records hold conversations, not alpaca columns; set "
                                               r"data.formatting=sharegpt"),
        ({"train_file": str(chat), "formatting": "sharegpt", "messages_column": "turns"}, DataError,
         r"column 'turns' is missing \(columns: conversations\); set data.messages_column"),
        ({"train_file": str(tmp_path / "missing.jsonl")}, DataError, r"missing.jsonl: file not found"),
    ]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cases.append(({"train_file": str(empty)}, DataError, "has no records"))
    for data, error, message in cases:
        with pytest.raises(error, match=message):
            prepare_data(_cfg(tmp_path, data), tiny)
    with pytest.raises(DataError, match=r"column 'text' is missing .* set model.task=causal-lm"):
        prepare_data(_cfg(tmp_path, {"train_file": str(alpaca)}, task="sequence-classification"),
                     load_tokenizer("builtin:tiny-bert"))


def test_a_jinja_file_that_fails_names_the_file_and_line(tmp_path, tiny):
    alpaca = _write(tmp_path / "a.jsonl", [{"instruction": "q", "output": "a"}] * 4)
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for message in messages %}\n{{ message['content'] }\n{% endfor %}")
    with pytest.raises(ConfigError, match=r"data.template: .*broken.jinja, line 2: "):
        prepare_data(_cfg(tmp_path, {"train_file": str(alpaca), "template": str(broken)}), tiny)
    raising = tmp_path / "raising.jinja"
    raising.write_text("{% for message in messages %}\n{{ message['content'] | nosuchfilter }}{% endfor %}")
    with pytest.raises((ConfigError, DataError), match=r"raising.jinja"):
        prepare_data(_cfg(tmp_path, {"train_file": str(alpaca), "template": str(raising)}), tiny)


def test_tiny_llama_has_a_real_causal_lm_tokenizer(tiny):
    assert tiny.decode(tiny("Line one\nLine Two")["input_ids"]) == "Line one\nLine Two"  # cased, newlines kept
    assert tiny.eos_token == "</s>" and tiny.bos_token == "<s>" and tiny.pad_token == "<pad>"
    assert "token_type_ids" not in tiny("x") and tiny.chat_template


def test_fast_renderers_equal_their_jinja_source():
    import random

    from scaletrain.data.templates import FAST_RENDERERS

    rng = random.Random(0)
    words = ["hi", "Opposite", "of", "hot?", "\n", "cold", " ", "<tag>", "é", "multi\nline"]
    for _ in range(200):
        chat = [{"role": "system", "content": " ".join(rng.choices(words, k=3))}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 3)):
            user = " ".join(rng.choices(words, k=rng.randint(1, 6)))
            extra = " ".join(rng.choices(words, k=2)) if rng.random() < 0.3 else ""
            chat += [{"role": "user", "content": f"{user}\n{extra}" if extra else user, "instruction": user,
                      "input": extra}, {"role": "assistant", "content": " ".join(rng.choices(words, k=4))}]
        for template in FAST_RENDERERS:
            fast = render([chat], template, {"eos_token": "</s>", "bos_token": "<s>"}, "t")
            jinja = render([chat], template + "{# no fast path #}", {"eos_token": "</s>", "bos_token": "<s>"}, "t")
            assert fast == jinja


def test_multimodal_data_is_refused_not_trained_as_text(tmp_path, tiny):
    """LLaMA-Factory's mllm_demo shape (#62) for a text model: an `images` column, mapped in dataset_info.json or in
    the file itself, is one line naming it, never a text-only run that drops the images."""
    d = _dataset_dir(tmp_path)
    rows = [{"messages": [{"role": "user", "content": "<image>Who is this?"},
                          {"role": "assistant", "content": "A cat."}], "images": ["mllm_demo_data/1.jpg"]}]
    _write(d / "mllm_demo.jsonl", rows)
    info = json.loads((d / "dataset_info.json").read_text())
    info["mllm_demo"] = {"file_name": "mllm_demo.jsonl", "formatting": "sharegpt",
                         "columns": {"messages": "messages", "images": "images"},
                         "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                  "assistant_tag": "assistant"}}
    (d / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(DataError, match=r"mllm_demo.jsonl: its rows have an 'images' column, and "
                                        r"model.name_or_path is a text model"):
        prepare_data(_cfg(tmp_path, {"dataset_dir": str(d), "dataset": "mllm_demo", "template": "chatml"}), tiny)
    with pytest.raises(DataError, match=r"mllm_demo.jsonl: its rows have an 'images' column, and model.name_or_path "
                                        r"is a text model that would not see them; use a vision-language model"):
        prepare_data(_cfg(tmp_path, {"train_file": str(d / "mllm_demo.jsonl"), "formatting": "messages",
                                     "template": "chatml"}), tiny)
