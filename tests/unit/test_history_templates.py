"""Templates that write a conversation's history differently from its last turn (Qwen3's own: the reasoning of
turns before the last user query is dropped, the last turn keeps it): the whole conversation is rendered once with
the model's template, each assistant turn is located in that render, and the labels are exactly what the template
writes of each assistant turn (its reasoning where the template keeps it, its tool calls, its end-of-turn token),
never a token of a user, system or tool turn. Ids equal apply_chat_template's."""

from pathlib import Path

import pytest

from scaletrain.data.encode import assistant_mask
from scaletrain.data.spans import located_spans
from scaletrain.data.templates import render
from scaletrain.model.tokenizer import load_tokenizer

QWEN3 = (Path(__file__).parents[1] / "fixtures" / "chat_templates" / "qwen3_4b_thinking_2507.jinja").read_text()
SPECIAL = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _call(city: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}]}


CHATS = {
    "multi_turn": ([{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Opposite of hot?"}, {"role": "assistant", "content": "Cold."},
                    {"role": "user", "content": "Of fast?"}, {"role": "assistant", "content": "Slow."},
                    {"role": "user", "content": "Of up?"}, {"role": "assistant", "content": "Down."}],
                   None, ["Cold.<|im_end|>", "Slow.<|im_end|>", "\n</think>\n\nDown.<|im_end|>"]),
    # reasoning in every turn, inline and as reasoning_content: the history's is dropped by the template
    "reasoning": ([{"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4."},
                   {"role": "user", "content": "Times 3?"},
                   {"role": "assistant", "content": "12.", "reasoning_content": "4 x 3."}],
                  None, ["4.<|im_end|>", "4 x 3.\n</think>\n\n12.<|im_end|>"]),
    # two tool calls with their results after the last query: the calls without reasoning are written without a
    # think block (the template's rule for turns that are not the last), the final answer with its reasoning
    "tools": ([{"role": "user", "content": "Weather in Paris and Rome?"}, _call("Paris"),
               {"role": "tool", "content": '{"temp_c": 21}'}, _call("Rome"),
               {"role": "tool", "content": '{"temp_c": 25}'},
               {"role": "assistant", "content": "<think>\nBoth known.\n</think>\n\nParis 21 C, Rome 25 C."}],
              [WEATHER],
              ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>',
               "Both known.\n</think>\n\nParis 21 C, Rome 25 C.<|im_end|>"]),
}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("builtin:tiny-llama")


@pytest.mark.parametrize("case", list(CHATS))
def test_each_assistant_turn_is_what_the_models_template_writes_of_it(case, tok):
    chat, tools, expected = CHATS[case]
    (text,), (spans,) = render([chat], QWEN3, SPECIAL, "qwen3", [tools])
    real = tok.apply_chat_template(chat, tools=tools, chat_template=QWEN3, tokenize=False, **SPECIAL)
    assert text == real  # the one render of the whole conversation: the model's own
    assert [text[a:b] for a, b in spans] == expected
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == tok.apply_chat_template(chat, tools=tools, chat_template=QWEN3, tokenize=True,
                                                       return_dict=True, **SPECIAL)["input_ids"]
    mask = assistant_mask(enc["offset_mapping"], spans)
    labelled = tok.decode([t for t, m in zip(enc["input_ids"], mask) if m])
    assert labelled == "".join(expected)
    for m in chat:  # no user, system or tool text is ever a label
        if m["role"] != "assistant":
            assert m["content"] not in labelled


def test_prefix_stable_templates_keep_their_spans(tok):
    """A template whose prefixes render as prefixes (ChatML) gets the same spans either way."""
    from scaletrain.data.spans import assistant_spans
    from scaletrain.data.templates import BUILTIN_TEMPLATES

    chat = CHATS["multi_turn"][0]
    (text,), _ = render([chat], BUILTIN_TEMPLATES["chatml"], SPECIAL, "chatml")
    located = located_spans(chat, text, BUILTIN_TEMPLATES["chatml"], SPECIAL)
    assert [text[a:b] for a, b in located] == ["Cold.<|im_end|>", "Slow.<|im_end|>", "Down.<|im_end|>"]
    assert [text[a:b].rstrip("\n") for a, b in assistant_spans(chat, text, BUILTIN_TEMPLATES["chatml"], SPECIAL)] == \
        [text[a:b] for a, b in located]


def test_a_reply_the_template_also_writes_elsewhere_cannot_be_isolated():
    from scaletrain.errors import DataError

    echo = ("{% if messages|length > 3 %}<recap>{{ messages[1].content }}</s>{% endif %}"
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    with pytest.raises(DataError, match="writes an assistant turn's reply into other turns too.*mask_history"):
        render([chat], echo, {"eos_token": "</s>"}, "echo")


def _prepared(tmp_path, tok, rows, **data):
    import json

    from scaletrain.config import validate
    from scaletrain.data import prepare_data

    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                    "data": {"train_file": str(path), "formatting": "messages", "max_length": 256, "eval_ratio": 0,
                             **data},
                    "output": {"output_dir": str(tmp_path / "runs")}})
    return prepare_data(cfg, tok)


def _labelled(tok, example) -> str:
    return tok.decode([t for t, lab in zip(example["input_ids"], example["labels"]) if lab != -100])


ROWS = [{"messages": [{"role": "user", "content": f"Q{i}?"}, {"role": "assistant", "content": f"A{i}."},
                      {"role": "user", "content": f"R{i}?"},
                      {"role": "assistant", "content": f"B{i}.", "reasoning_content": f"think {i}"}]}
        for i in range(20)]


def test_qwen3_multi_turn_with_reasoning_trains_through_the_pipeline_and_says_what(tmp_path):
    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = QWEN3  # data.template=auto: the tokenizer's own
    spans = _prepared(tmp_path, tok, ROWS)
    by_text = {_labelled(tok, ex) for ex in spans.train}
    assert "A3.<|im_end|>think 3\n</think>\n\nB3.<|im_end|>" in by_text
    note = next(n for n in spans.notes if n.startswith("data: multi_turn="))
    assert note.startswith("data: multi_turn=spans: every assistant turn of the whole conversation") and \
        "20 train examples" in note and "tokens supervised" in note
    last = _prepared(tmp_path, tok, ROWS, mask_history=True)  # LLaMA-Factory's name for multi_turn: last
    assert "think 3\n</think>\n\nB3.<|im_end|>" in {_labelled(tok, ex) for ex in last.train}
    assert any(n.startswith("data: multi_turn=last: the last assistant turn only") for n in last.notes)


def test_reasoning_a_template_cannot_write_goes_into_the_reply_not_away(tmp_path):
    tok = load_tokenizer("builtin:tiny-llama")
    chatml = _prepared(tmp_path, tok, ROWS, template="chatml")
    assert "A3.<|im_end|><think>\nthink 3\n</think>\n\nB3.<|im_end|>" in {_labelled(tok, ex) for ex in chatml.train}


def test_one_example_per_turn_is_the_true_render_up_to_that_turn_with_the_loss_on_it(tmp_path):
    """data.multi_turn: per_turn: each assistant turn is an example of its own, the conversation up to it as
    apply_chat_template renders it (Qwen3's template writes the last turn's think block, which the history's
    render drops), the loss on that turn only; its cost is said; the eval split holds out whole conversations."""
    import re

    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = QWEN3
    per_turn = _prepared(tmp_path, tok, ROWS, multi_turn="per_turn")
    assert len(per_turn.train) == 40
    for ex in per_turn.train:
        text = tok.decode(ex["input_ids"])
        i = int(re.search(r"Q(\d+)\?", text).group(1))
        turns = 2 if f"R{i}?" in text else 1
        prefix = ROWS[i]["messages"][:2 * turns]
        assert ex["input_ids"] == tok.apply_chat_template(prefix, tokenize=True, return_dict=True)["input_ids"]
        assert _labelled(tok, ex) == ("\n</think>\n\nA{i}.<|im_end|>" if turns == 1 else
                                      "think {i}\n</think>\n\nB{i}.<|im_end|>").format(i=i)
    cost = next(n for n in per_turn.notes if "examples from" in n)
    assert "40 examples from 20 conversations, 1,730 tokens to run: 1.59x the 1,090 of one render" in cost
    said = next(n for n in per_turn.notes if n.startswith("data: multi_turn="))
    assert said.startswith("data: multi_turn=per_turn: one example per assistant turn") and "40 train examples" in said

    split = _prepared(tmp_path, tok, ROWS, multi_turn="per_turn", eval_ratio=0.25, overwrite_cache=True)
    of = lambda ds: {re.search(r"Q(\d+)\?", tok.decode(ex["input_ids"])).group(1) for ex in ds}
    assert (len(split.train), len(split.eval)) == (30, 10) and len(of(split.eval)) == 5
    assert not of(split.train) & of(split.eval)  # no turn of an eval conversation trains


def test_per_turn_and_mask_history_together_are_refused_in_one_line():
    from pydantic import ValidationError

    from scaletrain.config.data import DataConfig

    with pytest.raises(ValidationError, match="data.mask_history=true .* contradicts data.multi_turn=per_turn"):
        DataConfig(train_file="x.jsonl", multi_turn="per_turn", mask_history=True)


def test_enable_thinking_reaches_a_template_with_the_switch_and_is_refused_by_one_without(tmp_path):
    from scaletrain.errors import ConfigError, DataError

    tok = load_tokenizer("builtin:tiny-llama")
    switch = tmp_path / "switch.jinja"  # the generation-prompt switch Qwen3's hybrid template has, on every turn
    switch.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n"
                      "{% if m.role == 'assistant' and enable_thinking is defined and enable_thinking is false %}"
                      "<think>\n\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    plain = [{"messages": [{k: v for k, v in m.items() if k != "reasoning_content"} for m in r["messages"]]}
             for r in ROWS]
    off = _prepared(tmp_path, tok, plain, template=str(switch), enable_thinking=False)
    assert any("<think>\n\n</think>\n\nA3." in tok.decode(ex["input_ids"]) for ex in off.train)
    # reasoning in the data with the switch off: refused in one line, not trained silently (#60)
    with pytest.raises(DataError, match=r"data.enable_thinking=false, and 20 records carry reasoning \(the first: "
                                        r"line 1\).*remove data.enable_thinking or the reasoning"):
        _prepared(tmp_path, tok, ROWS, template=str(switch), enable_thinking=False, overwrite_cache=True)
    with pytest.raises(ConfigError, match="data.enable_thinking=false: the chat template .chatml. has no thinking "
                                          "switch"):
        _prepared(tmp_path, tok, ROWS, template="chatml", enable_thinking=False)


R1 = (Path(__file__).parents[1] / "fixtures" / "chat_templates" / "deepseek_r1_distill_qwen_32b.jinja").read_text()
R1_SPECIAL = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}


def test_deepseek_r1s_template_trains_each_answer_as_it_writes_it(tok):
    """R1's template drops every turn's reasoning and its generation prompt opens <think>: the history is not a
    prefix of the prompts, so the turns are located in the whole render; each trains its answer and end token."""
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4."},
            {"role": "user", "content": "Times 3?"}, {"role": "assistant", "content": "<think>\nmul\n</think>\n\n12."}]
    (text,), (spans,) = render([chat], R1, R1_SPECIAL, "deepseek_r1")
    assert text == tok.apply_chat_template(chat, chat_template=R1, tokenize=False, **R1_SPECIAL)
    assert [text[a:b] for a, b in spans] == ["\n\n4.<｜end▁of▁sentence｜>", "\n\n12.<｜end▁of▁sentence｜>"]
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    labelled = tok.decode([t for t, m in zip(enc["input_ids"], assistant_mask(enc["offset_mapping"], spans)) if m])
    assert labelled == "\n\n4.<｜end▁of▁sentence｜>\n\n12.<｜end▁of▁sentence｜>" and "2+2?" not in labelled


R1_TURNS = [{"role": "system", "content": "Be exact."},
            {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4."},
            {"role": "user", "content": "Times 3?"}, {"role": "assistant", "content": "<think>\nmul\n</think>\n\n12."}]


@pytest.mark.parametrize("case", ["plain", "reasoning", "reasoning_content"])
def test_the_deepseek_r1_builtin_writes_r1s_format_and_trains_the_last_reasoning(tok, case):
    """deepseek_r1 against R1-Distill's own template: without reasoning the same ids; with reasoning in every turn
    the history as R1 writes it (reasoning dropped) and the last turn as R1's generation prompt opens it, then the
    reasoning, the answer and its end: what the model produces at inference. Only assistant parts are labels."""
    from scaletrain.data.templates import BUILTIN_TEMPLATES

    chat = [dict(m) for m in R1_TURNS]
    if case == "plain":
        for m in chat:
            m["content"] = m["content"].split("</think>\n\n")[-1]
    elif case == "reasoning_content":
        for m in chat[2::2]:
            reasoning, answer = m["content"].removeprefix("<think>\n").split("\n</think>\n\n")
            m.update(content=answer, reasoning_content=reasoning)
    (text,), (spans,) = render([chat], BUILTIN_TEMPLATES["deepseek_r1"], R1_SPECIAL, "deepseek_r1")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if case == "plain":
        assert ids == tok.apply_chat_template(chat, chat_template=R1, tokenize=True, return_dict=True,
                                              **R1_SPECIAL)["input_ids"]
        assert [text[a:b] for a, b in spans] == ["4.<｜end▁of▁sentence｜>", "12.<｜end▁of▁sentence｜>"]
        return
    prompt = tok.apply_chat_template(chat[:-1], chat_template=R1, tokenize=False, add_generation_prompt=True,
                                     **R1_SPECIAL)
    assert prompt.endswith("<｜Assistant｜><think>\n") and "add" not in prompt  # R1 drops the history's reasoning
    assert text == prompt + "mul\n</think>\n\n12.<｜end▁of▁sentence｜>"
    replies = [text[a:b] for a, b in spans]
    assert replies[0].endswith("4.<｜end▁of▁sentence｜>") and "add" not in replies[0]
    assert replies[1] == "mul\n</think>\n\n12.<｜end▁of▁sentence｜>"  # after the prompt's "<think>\n" (#60)
    assert "Be exact." not in "".join(replies) and "Times 3?" not in "".join(replies)


def test_a_refusal_names_the_built_in_of_the_tokenizers_own_format(tmp_path):
    from scaletrain.data.templates import builtin_for, render_advice
    from scaletrain.errors import DataError

    assert builtin_for(QWEN3) == "qwen3" and builtin_for("<|start_header_id|>") == "llama3.1"
    assert builtin_for("{{ messages }}") is None
    assert "data.template=gemma" in render_advice("System role not supported", "tokenizer", "<start_of_turn>")
    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = ("{% if messages | length > 2 %}{{ raise_exception('Only one exchange is supported') }}"
                         "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                         "{% endfor %}")
    with pytest.raises(DataError, match=r"Only one exchange is supported; fix those records, or use "
                                         r"data.template=qwen \(the built-in of this template's own turn format"):
        _prepared(tmp_path, tok, ROWS)


GPT_OSS = (Path(__file__).parents[1] / "fixtures" / "chat_templates" / "gpt_oss_120b.jinja").read_text()
GPT_OSS_SPECIAL = {"eos_token": "<|return|>", "pad_token": "<|endoftext|>"}
FINAL = "<|start|>assistant<|channel|>final<|message|>"
GPT_OSS_CHATS = {
    # harmony ends the last turn with <|return|> and earlier ones with <|end|>: each turn ends at its own
    "multi_turn": ([{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Opposite of hot?"}, {"role": "assistant", "content": "Cold."},
                    {"role": "user", "content": "Of fast?"}, {"role": "assistant", "content": "Slow."},
                    {"role": "user", "content": "Of up?"}, {"role": "assistant", "content": "Down."}],
                   None, ["<|channel|>final<|message|>Cold.<|end|>", "<|channel|>final<|message|>Slow.<|end|>",
                          "<|channel|>final<|message|>Down.<|return|>"]),
    # reasoning as <think> in the reply and as reasoning_content: the template's `thinking` (its analysis channel),
    # written for the last turn only (harmony drops the history's chain of thought)
    "reasoning": ([{"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4."},
                   {"role": "user", "content": "Times 3?"},
                   {"role": "assistant", "content": "12.", "reasoning_content": "4 x 3."}],
                  None, ["<|channel|>final<|message|>4.<|end|>",
                         "<|channel|>analysis<|message|>4 x 3.<|end|>" + FINAL + "12.<|return|>"]),
    # two calls, each its own message as harmony writes them (to=functions.NAME ... <|call|>), their results in
    # functions.NAME turns, then the answer with its reasoning
    "tools": ([{"role": "user", "content": "Weather in Paris and Rome?"}, _call("Paris"),
               {"role": "tool", "content": '{"temp_c": 21}'}, _call("Rome"),
               {"role": "tool", "content": '{"temp_c": 25}'},
               {"role": "assistant", "content": "<think>Both known.</think>Paris 21 C, Rome 25 C."}],
              [WEATHER],
              [' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
               ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Rome"}<|call|>',
               "<|channel|>analysis<|message|>Both known.<|end|>" + FINAL + "Paris 21 C, Rome 25 C.<|return|>"]),
}


@pytest.mark.parametrize("case", list(GPT_OSS_CHATS))
def test_gpt_oss_harmony_trains_each_turn_as_its_template_writes_it(case, tok):
    """gpt-oss's own template (data.template: auto with its tokenizer): ids equal apply_chat_template's, each
    assistant turn's labels are what the model writes after <|start|>assistant (channels, calls, the end token of
    its place), never a token of a user, system or tool turn."""
    from scaletrain.data.template_input import with_reasoning

    chat, tools, expected = GPT_OSS_CHATS[case]
    chat = with_reasoning(chat, GPT_OSS)
    (text,), (spans,) = render([chat], GPT_OSS, GPT_OSS_SPECIAL, "gpt_oss", [tools])
    assert text == tok.apply_chat_template(chat, tools=tools, chat_template=GPT_OSS, tokenize=False,
                                           **GPT_OSS_SPECIAL)
    assert [text[a:b] for a, b in spans] == expected
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    labelled = tok.decode([t for t, m in zip(enc["input_ids"], assistant_mask(enc["offset_mapping"], spans)) if m])
    for m in chat:
        if m["role"] != "assistant":
            assert m["content"] not in labelled
    if case == "reasoning":
        assert "Add them." not in text  # the history's reasoning: harmony drops it


def test_a_turn_end_the_last_turn_does_not_show_is_refused_not_trained_into_the_next_turn(tok, monkeypatch):
    """Without the history's own end of turn (<|end|>), the first turn would run on into the next user turn: the
    span check refuses it in one line instead of training a prompt."""
    from scaletrain.data import spans as sp
    from scaletrain.errors import DataError

    real = sp.turn_marks
    monkeypatch.setattr(sp, "turn_marks", lambda t, s: (lambda h, e, _: (h, e, e))(*real(t, s)))
    chat = GPT_OSS_CHATS["multi_turn"][0]
    with pytest.raises(DataError, match="ends an assistant turn in a way its last turn does not show.*per_turn"):
        render([chat], GPT_OSS, GPT_OSS_SPECIAL, "gpt_oss")


TOOL_SCHEMAS = [WEATHER, {"type": "function", "function": {
    "name": "search", "description": "Search the docs.", "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "What to find."},
        "kind": {"type": "string", "enum": ["api", "guide"], "default": "api"},
        "limit": {"type": "integer", "default": 5},
        "exact": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "scores": {"type": "array", "items": {"type": "number"}, "nullable": True},
        "filters": {"type": "array", "items": {"type": "object"}},
        "since": {"type": ["string", "null"]},
        "note": {"type": "string", "nullable": True},
        "extra": {"type": "object"}},
        "required": ["query"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time."}}]
BUILTIN_GPT_OSS_CHATS = {
    **{k: (c, t) for k, (c, t, _) in GPT_OSS_CHATS.items()},
    "developer_and_tools": ([{"role": "developer", "content": "Answer in French."},
                             {"role": "user", "content": "Find the guide."},
                             {"role": "assistant", "content": "", "tool_calls": [
                                 {"type": "function", "function": {"name": "search",
                                                                   "arguments": {"query": "guide", "kind": "guide"}}}]},
                             {"role": "tool", "content": "found"},
                             {"role": "assistant", "content": "Trouvé."}], TOOL_SCHEMAS),
    # a call with reasoning and no later answer: harmony keeps its analysis
    "call_last": ([{"role": "user", "content": "Time?"},
                   {"role": "assistant", "content": "", "reasoning_content": "Ask the clock.",
                    "tool_calls": [{"type": "function", "function": {"name": "now", "arguments": {}}}]}],
                  TOOL_SCHEMAS),
}


@pytest.mark.parametrize("case", list(BUILTIN_GPT_OSS_CHATS))
def test_the_gpt_oss_builtin_equals_gpt_oss_own_template_and_marks_what_is_trained(case, tok):
    """data.template: gpt_oss against gpt-oss-120b's own template: the same text and ids (the system message's date
    and reasoning effort, the developer message, the tools' TypeScript declarations, channels, calls), and its
    generation marks train exactly what the turns located in the real template's render are."""
    from scaletrain.data.template_input import with_reasoning
    from scaletrain.data.templates import BUILTIN_TEMPLATES, builtin_for

    builtin = BUILTIN_TEMPLATES["gpt_oss"]
    assert builtin_for(GPT_OSS) == "gpt_oss"  # a refusal under the model's template names this built-in
    chat, tools = BUILTIN_GPT_OSS_CHATS[case]
    (real,), (real_spans,) = render([with_reasoning(chat, GPT_OSS)], GPT_OSS, GPT_OSS_SPECIAL, "gpt_oss", [tools])
    (text,), (spans,) = render([with_reasoning(chat, builtin)], builtin, GPT_OSS_SPECIAL, "gpt_oss", [tools])
    assert text == real
    assert tok(text, add_special_tokens=False)["input_ids"] == tok.apply_chat_template(
        with_reasoning(chat, GPT_OSS), tools=tools, chat_template=GPT_OSS, tokenize=True, return_dict=True,
        **GPT_OSS_SPECIAL)["input_ids"]
    assert [text[a:b] for a, b in spans] == [real[a:b] for a, b in real_spans]
    if case == "developer_and_tools":
        assert "kind?: \"api\" | \"guide\", // default: api,\nlimit?: number, // default: 5," in text
        assert "type now = () => any;" in text and "# Instructions\n\nAnswer in French." in text
    if case == "call_last":
        assert [text[a:b] for a, b in spans] == [
            "<|channel|>analysis<|message|>Ask the clock.<|end|><|start|>assistant to=functions.now<|channel|>"
            "commentary json<|message|>{}<|call|>"]


@pytest.mark.parametrize("chat,why", [
    ([{"role": "user", "content": "Both?"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "now", "arguments": {}}},
        {"type": "function", "function": {"name": "now", "arguments": {}}}]}], "one tool call per assistant message"),
    ([{"role": "user", "content": "Hi"}, {"role": "system", "content": "Late."},
      {"role": "assistant", "content": "Yo"}], "a system message after the first"),
    ([{"role": "user", "content": "Hi"}, {"role": "tool", "content": "x"}, {"role": "assistant", "content": "Yo"}],
     "a tool result without an assistant call"),
])
def test_the_gpt_oss_builtin_refuses_what_the_models_template_would_drop(tok, chat, why):
    """The model's own template keeps the first call of a message and skips a later system message without a word;
    the built-in refuses such a record (a counted skip, in the template's words) rather than train less than given."""
    from scaletrain.data.templates import BUILTIN_TEMPLATES, render_records

    (out,) = render_records([chat], BUILTIN_TEMPLATES["gpt_oss"], GPT_OSS_SPECIAL, [TOOL_SCHEMAS])
    assert isinstance(out, str) and why in out


QWEN3_HYBRID = (Path(__file__).parents[1] / "fixtures" / "chat_templates" / "qwen3_0_6b.jinja").read_text()


@pytest.mark.parametrize("case", list(CHATS))
def test_hybrid_qwen3s_template_trains_each_turn_and_the_qwen3_builtin_writes_the_same(case, tok):
    """The first Qwen3 release (Qwen3-0.6B ... 235B, one hybrid template with enable_thinking; LLaMA-Factory's
    `qwen3`): the same render of a training conversation as Thinking-2507's and the `qwen3` built-in's; its
    generation prompt does not open <think>, so the last turn's labels begin with it (what the model writes)."""
    from scaletrain.data.templates import BUILTIN_TEMPLATES

    chat, tools, expected = CHATS[case]
    (text,), (spans,) = render([chat], QWEN3_HYBRID, SPECIAL, "qwen3", [tools])
    assert text == tok.apply_chat_template(chat, tools=tools, chat_template=QWEN3_HYBRID, tokenize=False, **SPECIAL)
    assert text == render([chat], QWEN3, SPECIAL, "qwen3", [tools])[0][0]
    assert text == render([chat], BUILTIN_TEMPLATES["qwen3"], SPECIAL, "qwen3", [tools])[0][0]
    last = expected[-1] if expected[-1].startswith("<think>") else "<think>\n" + expected[-1]
    assert [text[a:b] for a, b in spans] == [*expected[:-1], last]
    prompt = tok.apply_chat_template(chat[:-1], tools=tools, chat_template=QWEN3_HYBRID, tokenize=False,
                                     add_generation_prompt=True, enable_thinking=False, **SPECIAL)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # what enable_thinking=false means


QWEN3_INSTRUCT = (Path(__file__).parents[1] / "fixtures" / "chat_templates" /
                  "qwen3_4b_instruct_2507.jinja").read_text()


@pytest.mark.parametrize("case", list(CHATS))
def test_qwen3_instruct_2507s_template_and_the_qwen3_nothink_builtin_train_the_same_tokens(case, tok):
    """Qwen3-Instruct-2507 (LLaMA-Factory's qwen3_nothink): its own template, through data.template: auto, and the
    qwen3_nothink built-in render the same text and train the same parts of it (the last turn from its <think>
    block on, as the model writes it after a generation prompt that opens none); the built-in's generation prompt is
    the model's own; a refusal under this template names qwen3_nothink, not the thinking built-in."""
    from scaletrain.data.templates import BUILTIN_TEMPLATES, builtin_for

    chat, tools, expected = CHATS[case]
    own_text, own_spans = (x[0] for x in render([chat], QWEN3_INSTRUCT, SPECIAL, "tokenizer", [tools]))
    ours_text, ours_spans = (x[0] for x in render([chat], BUILTIN_TEMPLATES["qwen3_nothink"], SPECIAL,
                                                  "qwen3_nothink", [tools]))
    assert own_text == ours_text == tok.apply_chat_template(chat, tools=tools, chat_template=QWEN3_INSTRUCT,
                                                            tokenize=False, **SPECIAL)
    # the model writes no think block: the template's empty one is no label, a think block of the data's is (#60)
    last = expected[-1].removeprefix("\n</think>\n\n") if expected[-1].startswith("\n</think>") else \
        "<think>\n" + expected[-1]
    assert [own_text[a:b] for a, b in own_spans] == [ours_text[a:b] for a, b in ours_spans] == [*expected[:-1], last]
    prompt = tok.apply_chat_template(chat[:-1], tools=tools, chat_template=QWEN3_INSTRUCT, tokenize=False,
                                     add_generation_prompt=True, **SPECIAL)
    assert prompt.endswith("<|im_start|>assistant\n") and prompt == tok.apply_chat_template(
        chat[:-1], tools=tools, chat_template=BUILTIN_TEMPLATES["qwen3_nothink"], tokenize=False,
        add_generation_prompt=True, **SPECIAL)
    assert builtin_for(QWEN3_INSTRUCT) == "qwen3_nothink" and builtin_for(QWEN3) == builtin_for(QWEN3_HYBRID) == "qwen3"
