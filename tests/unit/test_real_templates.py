"""Built-in chat templates against the real ones (tests/fixtures/chat_templates, sources in its SOURCES.md): token
ids equal to ``apply_chat_template`` with the model's own template, for a system prompt, none, several turns and
tool calls with their results; the labels are exactly the assistant parts; tool data is never dropped silently."""

import json
from pathlib import Path

import pytest

from scaletrain.config import validate
from scaletrain.data import IGNORE_INDEX, prepare_data
from scaletrain.data.templates import BUILTIN_TEMPLATES, TOOL_TEMPLATES, render, supports_tools
from scaletrain.errors import DataError
from scaletrain.model.tokenizer import load_tokenizer

REAL = Path(__file__).parents[1] / "fixtures" / "chat_templates"
# built-in -> the model template it reproduces
MODEL = {"qwen": "qwen2_5_instruct.jinja", "qwen2": "qwen2_instruct.jinja", "qwen3": "qwen3_4b_thinking_2507.jinja",
         "qwen3_nothink": "qwen3_4b_instruct_2507.jinja",
         "llama3": "llama3_instruct.jinja",
         "llama3.1": "llama3_1_instruct.jinja", "mistral": "mistral_7b_instruct_v0_3.jinja",
         "mistral_v1": "mistral_7b_instruct_v0_1.jinja", "gemma": "gemma_2_it.jinja", "gemma3": "gemma3_it.jinja"}
# Templates that have no system role: the built-in folds it into the first user turn (LLaMA-Factory's choice).
FOLDS_SYSTEM = ("gemma", "mistral_v1")

WEATHER = {"name": "get_weather", "description": "Current weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"name": "get_time", "description": "Local time of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TOOLS = [{"type": "function", "function": WEATHER}, {"type": "function", "function": TIME}]


def _call(name: str, city: str, call_id: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": call_id, "function": {"name": name, "arguments": {"city": city}}}]}


CHATS = {
    "system": [{"role": "system", "content": "You are a helpful assistant. "},
               {"role": "user", "content": "Opposite of hot?"}, {"role": "assistant", "content": "Cold."}],
    "no_system": [{"role": "user", "content": "Opposite of hot?"}, {"role": "assistant", "content": "Cold."}],
    "multi_turn": [{"role": "user", "content": "Opposite of hot?"}, {"role": "assistant", "content": "Cold."},
                   {"role": "user", "content": "And of fast?\nBe brief."}, {"role": "assistant", "content": "Slow."}],
    "tools": [{"role": "user", "content": "Weather and time in Paris?"}, _call("get_weather", "Paris", "call00001"),
              {"role": "tool", "content": '{"temp_c": 21}', "tool_call_id": "call00001"},
              _call("get_time", "Paris", "call00002"),
              {"role": "tool", "content": '{"time": "14:05"}', "tool_call_id": "call00002"},
              {"role": "assistant", "content": "21 C, and it is 14:05."}],
}
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("builtin:tiny-llama")


def _real_ids(tok, name: str, chat: list[dict], tools, **kw) -> list[int]:
    real = (REAL / MODEL[name]).read_text()
    return tok.apply_chat_template(chat, tools=tools, chat_template=real, tokenize=True, return_dict=True,
                                   **kw)["input_ids"]


def _ours(tok, name: str, chat: list[dict], tools) -> tuple[list[int], str, list[tuple[int, int]]]:
    (text,), (spans,) = render([chat], BUILTIN_TEMPLATES[name], SPECIAL, name, [tools])
    return tok(text, add_special_tokens=False)["input_ids"], text, spans


def _folded(chat: list[dict]) -> list[dict]:
    """The system prompt inside the first user turn, as the built-ins without a system role write it."""
    system, rest = chat[0]["content"], [dict(m) for m in chat[1:]]
    rest[0]["content"] = system + "\n\n" + rest[0]["content"]
    return rest


@pytest.mark.parametrize("case", list(CHATS))
@pytest.mark.parametrize("name", list(MODEL))
def test_builtin_equals_the_models_own_template(name, case, tok):
    chat, tools = CHATS[case], TOOLS if case == "tools" else None
    if tools and name not in TOOL_TEMPLATES:
        assert not supports_tools(BUILTIN_TEMPLATES[name])  # refused in the data pipeline (tested below)
        return
    ours, text, spans = _ours(tok, name, chat, tools)
    if case == "system" and name in FOLDS_SYSTEM:
        assert ours == _real_ids(tok, name, _folded(chat), tools)
    elif case == "system" and name == "mistral":
        # Mistral v0.3 keeps a system prompt only in a last user message that ends the conversation: ours writes
        # it there always, so the real rendering of the prompt is ours up to the reply.
        prompt = _real_ids(tok, name, chat[:-1], tools, add_generation_prompt=True)
        assert ours[:len(prompt)] == prompt and tok.decode(ours[len(prompt):]) == " Cold.</s>"
    else:
        assert ours == _real_ids(tok, name, chat, tools)
    if case == "system" and not name.startswith("llama"):  # as written (Llama's own templates trim it)
        assert "You are a helpful assistant. \n\n" in text or "You are a helpful assistant. <" in text
    replies = [text[a:b] for a, b in spans]
    assert len(replies) == sum(m["role"] == "assistant" for m in chat)
    for reply in replies:  # tool results are never labels
        assert "temp_c" not in reply and "14:05\"" not in reply


def test_each_templates_assistant_parts_are_the_labels(tmp_path, tok):
    """Through the whole pipeline: the trained tokens decode to each reply or call, with its end of turn."""
    row = {"messages": CHATS["tools"], "tools": json.dumps([WEATHER, TIME])}
    expected = {
        "qwen": ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
                 '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
                 "21 C, and it is 14:05.<|im_end|>"],
        "qwen3": ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
                  '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
                  # its empty block closed: the last turn, after the generation prompt's "<think>\n" (#60)
                  "\n</think>\n\n21 C, and it is 14:05.<|im_end|>"],
        "qwen3_nothink": [  # Instruct-2507 writes no think block at inference: the template's empty one is no label
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
            '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
            "21 C, and it is 14:05.<|im_end|>"],
        "llama3.1": ['{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
                     '{"name": "get_time", "parameters": {"city": "Paris"}}<|eot_id|>',
                     "21 C, and it is 14:05.<|eot_id|>"],
        "mistral": ['[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call00001"}]</s>',
                    '[TOOL_CALLS] [{"name": "get_time", "arguments": {"city": "Paris"}, "id": "call00002"}]</s>',
                    " 21 C, and it is 14:05.</s>"],
        "gpt_oss": [' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
                    ' to=functions.get_time<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
                    "<|channel|>final<|message|>21 C, and it is 14:05.<|return|>"],
    }
    for name in TOOL_TEMPLATES:
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(row) + "\n")
        cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                        "data": {"train_file": str(path), "formatting": "messages", "template": name,
                                 "eval_ratio": 0.0, "max_length": 4096},
                        "output": {"output_dir": str(tmp_path / name)}})
        ex = prepare_data(cfg, tok).train[0]
        runs, cur = [], []
        for t, label in zip(ex["input_ids"], ex["labels"]):
            if label != IGNORE_INDEX:
                cur.append(t)
            elif cur:
                runs, cur = runs + [tok.decode(cur)], []
        runs += [tok.decode(cur)] if cur else []
        assert [r.replace("\u0120", " ") for r in runs] == expected[name], name
        assert "get_time" in tok.decode(ex["input_ids"][:ex["labels"].index(next(x for x in ex["labels"]
                                                                                  if x != IGNORE_INDEX))])


def test_two_calls_in_one_message_and_their_results(tok):
    """Qwen2.5 and Mistral write parallel calls in one message; Llama 3.1 allows one (its own words, per record)."""
    both = {"role": "assistant", "content": "", "tool_calls": _call("get_weather", "Paris", "call00001")["tool_calls"]
            + _call("get_time", "Paris", "call00002")["tool_calls"]}
    chat = [CHATS["tools"][0], both, CHATS["tools"][2], CHATS["tools"][4], CHATS["tools"][5]]
    for name in ("qwen", "mistral"):
        assert _ours(tok, name, chat, TOOLS)[0] == _real_ids(tok, name, chat, TOOLS)
    with pytest.raises(DataError, match="one tool call per assistant message"):
        render([chat], BUILTIN_TEMPLATES["llama3.1"], SPECIAL, "llama3.1", [TOOLS])


GLAIVE = {  # LLaMA-Factory's glaive_toolcall_en_demo shape: sharegpt turns, a JSON "tools" column
    "conversations": [
        {"from": "human", "value": "Convert 500 USD to EUR."},
        {"from": "function_call", "value": json.dumps({"name": "convert", "arguments": {"amount": 500, "to": "EUR"}})},
        {"from": "observation", "value": json.dumps({"converted": 425.5})},
        {"from": "gpt", "value": "500 USD is 425.50 EUR."}],
    "tools": json.dumps([{"name": "convert", "description": "Convert currency.",
                          "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}}}]),
    "system": "You are a helpful assistant. "}


def _lf_dir(tmp_path: Path, rows: list[dict], entry: dict, name: str = "glaive.json") -> Path:
    d = tmp_path / "lf"
    d.mkdir(exist_ok=True)
    (d / name).write_text(json.dumps(rows))
    (d / "dataset_info.json").write_text(json.dumps({"demo": {"file_name": name, **entry}}))
    return d


def _lf_cfg(tmp_path: Path, d: Path, **data) -> object:
    return validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                     "data": {"dataset_dir": str(d), "dataset": ["demo"], "eval_ratio": 0.0, "max_length": 2048,
                              **data},
                     "output": {"output_dir": str(tmp_path / "runs")}})


SHAREGPT_TOOLS = {"formatting": "sharegpt", "columns": {"messages": "conversations", "tools": "tools",
                                                        "system": "system"}}


def test_a_glaive_toolcall_dataset_trains_with_its_tools_in_the_models_format(tmp_path, tok):
    cfg = _lf_cfg(tmp_path, _lf_dir(tmp_path, [GLAIVE], SHAREGPT_TOOLS), template="qwen")
    ex = prepare_data(cfg, tok).train[0]
    text = tok.decode(ex["input_ids"])
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant. \n\n# Tools")  # kept as written
    assert '{"type": "function", "function": {"name": "convert"' in text  # declared, as Qwen2.5 declares tools
    assert '<|im_start|>user\n<tool_response>\n{"converted": 425.5}\n</tool_response><|im_end|>' in text
    trained = tok.decode([t for t, y in zip(ex["input_ids"], ex["labels"]) if y != IGNORE_INDEX])
    assert trained == ('<tool_call>\n{"name": "convert", "arguments": {"amount": 500, "to": "EUR"}}\n</tool_call>'
                       "<|im_end|>500 USD is 425.50 EUR.<|im_end|>")  # the call and the reply, never the result


def test_tool_data_under_a_template_without_a_tool_format_is_one_error(tmp_path, tok):
    cfg = _lf_cfg(tmp_path, _lf_dir(tmp_path, [GLAIVE, GLAIVE], SHAREGPT_TOOLS), template="chatml")
    with pytest.raises(DataError, match=r"2 records declare or call tools .*data.template=chatml has no tool "
                                        r"format; .*qwen, qwen3, qwen3_nothink, llama3.1, mistral"):
        prepare_data(cfg, tok)


def test_a_model_template_that_refuses_a_system_prompt_skips_those_records_in_its_own_words(tmp_path):
    """gemma-2-it's own template under data.template=auto: records with a system prompt are skipped and counted;
    past max_bad_ratio the advice is the built-in that folds the system prompt."""
    from transformers import AutoTokenizer

    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = (REAL / "gemma_2_it.jinja").read_text()
    tok.save_pretrained(str(tmp_path / "tok"))
    gemma = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), local_files_only=True)
    plain = {"instruction": "Opposite of hot?", "output": "Cold."}
    rows = [plain] * 9 + [{**plain, "system": "Be terse."}]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def cfg(ratio):
        return validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                         "data": {"train_file": str(path), "eval_ratio": 0.0, "max_bad_ratio": ratio},
                         "output": {"output_dir": str(tmp_path / f"runs{ratio}")}})

    prepared = prepare_data(cfg(0.2), gemma)
    assert len(prepared.train) == 9
    assert any("line 10" in n and "System role not supported" in n for n in prepared.notes)
    with pytest.raises(DataError, match=r"line 10: the chat template cannot render it: System role not supported; "
                                        r".*data.template=gemma \(folds the system prompt"):
        prepare_data(cfg(0.05), gemma)


def test_pretraining_reads_llamafactory_txt_datasets_line_by_line(tmp_path, tok):
    d = tmp_path / "lf"
    d.mkdir()
    (d / "wiki_demo.txt").write_text("First paragraph of the wiki.\n\nSecond one.\n")
    (d / "dataset_info.json").write_text(json.dumps({"demo": {"file_name": "wiki_demo.txt",
                                                              "columns": {"prompt": "text"}}}))
    prepared = prepare_data(_lf_cfg(tmp_path, d, formatting="text"), tok)
    texts = sorted(tok.decode(ex["input_ids"]) for ex in prepared.train)
    assert texts == ["First paragraph of the wiki.</s>", "Second one.</s>"]


REASONING = {
    "in_the_content": [{"role": "user", "content": "2+2?"},
                       {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4."}],
    "in_every_turn": [{"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4.", "reasoning_content": "add"},
                      {"role": "user", "content": "3+3?"},
                      {"role": "assistant", "content": "<think>add again</think>6."},
                      {"role": "user", "content": "4+4?"},
                      {"role": "assistant", "content": "8.", "reasoning_content": "and again"}],
    "after_a_tool": [{"role": "user", "content": "Weather in Paris?"}, _call("get_weather", "Paris", "call00001"),
                     {"role": "tool", "content": '{"temp_c": 21}', "tool_call_id": "call00001"},
                     {"role": "assistant", "content": "21 C.", "reasoning_content": "The tool said 21."}],
}


@pytest.mark.parametrize("case", list(REASONING))
def test_qwen3_reasoning_follows_its_templates_history_rule(case, tok):
    """Qwen3's thinking template: reasoning (a reasoning_content field, or <think> in the content) is written for
    turns after the last user query and dropped before it; the built-in's ids equal the real template's, and each
    assistant part, reasoning included where it is written, is what trains."""
    chat = REASONING[case]
    tools = TOOLS if case == "after_a_tool" else None
    ours, text, spans = _ours(tok, "qwen3", chat, tools)
    assert ours == _real_ids(tok, "qwen3", chat, tools)
    replies = [text[a:b] for a, b in spans]
    if case == "in_the_content":
        # the built-in's generation prompt (Thinking-2507's) writes "<think>\n": the labels begin after it (#60)
        assert replies == ["add them\n</think>\n\n4.<|im_end|>"]
    elif case == "in_every_turn":  # earlier turns' reasoning dropped, as the model's template writes them
        assert replies == ["4.<|im_end|>", "6.<|im_end|>", "and again\n</think>\n\n8.<|im_end|>"]
    else:  # after the tool result the user query is still the last one: the reasoning is written and trained
        assert replies[-1] == "The tool said 21.\n</think>\n\n21 C.<|im_end|>"
        assert "temp_c" not in "".join(replies)


def test_a_qwen3_template_is_answered_with_the_qwen3_builtin():
    from scaletrain.data.templates import builtin_for

    assert builtin_for((REAL / MODEL["qwen3"]).read_text()) == "qwen3"
    assert builtin_for((REAL / MODEL["qwen"]).read_text()) == "qwen"
