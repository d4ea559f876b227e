"""Nothing silent, round four (#60): reasoning and tool turns trained as the model writes them, against the models'
released templates (tests/fixtures/chat_templates, sources in its SOURCES.md). The labels of a turn are what the
model writes after its generation prompt (ids equal apply_chat_template's); where a template writes a turn
otherwise (its history form), drops a part, or the data contradicts a setting, it is said in one line or refused."""

from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from scaletrain.data.template_input import with_reasoning
from scaletrain.data.templates import BUILTIN_TEMPLATES, EMPTY_THINK, render, render_records
from scaletrain.model.tokenizer import load_tokenizer

REAL = Path(__file__).parents[1] / "fixtures" / "chat_templates"
QWEN = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
R1_SPECIAL = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
OSS = {"eos_token": "<|return|>"}
MODELS = {  # fixture -> its special tokens
    "qwen3_4b_thinking_2507": QWEN, "qwen3_4b_instruct_2507": QWEN, "qwen3_0_6b": QWEN, "qwen2_5_instruct": QWEN,
    "deepseek_r1_distill_qwen_32b": R1_SPECIAL, "gpt_oss_120b": OSS, "gemma3_it": {"bos_token": "<bos>"},
    "llama3_1_instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _call(city: str, **extra) -> dict:
    return {"role": "assistant", "content": "", **extra, "tool_calls": [
        {"type": "function", "id": f"call{city[:5]:0<5}", "function": {"name": "get_weather",
                                                                     "arguments": {"city": city}}}]}


def _source(name: str) -> str:
    return (REAL / f"{name}.jinja").read_text()


def _what_the_model_writes(chat, template, special, tools=None) -> str:
    """The text after the generation prompt in the render of ``chat`` (which ends with the turn): what the model
    writes at inference, through its end-of-turn token."""
    chat = with_reasoning(chat, template)
    (prompt,), _ = render_jinja_template([chat[:-1]], tools=tools, chat_template=template, add_generation_prompt=True,
                                         **special)
    (whole,), _ = render_jinja_template([chat], tools=tools, chat_template=template, **special)
    assert whole.startswith(prompt), "the template writes the last turn's context differently from its prompt"
    return whole[len(prompt):].rstrip(" \n")


CHATS = {
    "plain": [{"role": "user", "content": "Opposite of hot?"}, {"role": "assistant", "content": "Cold."},
              {"role": "user", "content": "Of up?"}, {"role": "assistant", "content": "Down."}],
    "reasoning": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4.",
                                                        "reasoning_content": "Add them."},
                  {"role": "user", "content": "Times 3?"}, {"role": "assistant", "content": "12.",
                                                             "reasoning_content": "4 x 3."}],
}


@pytest.mark.parametrize("case", list(CHATS))
@pytest.mark.parametrize("name", list(MODELS))
def test_each_turn_as_the_last_trains_what_the_model_writes_after_its_generation_prompt(name, case):
    """multi_turn=per_turn (and the last turn under spans): the labels are the text after the generation prompt,
    through the end-of-turn token and not the template's line break after it; a model that never writes a think
    block (Qwen3-Instruct-2507) is not trained on the empty one its template writes; a generation prompt that
    opens <think> (Thinking-2507, R1) is not trained as the model's."""
    from scaletrain.data.template_facts import facts

    template, special = _source(name), MODELS[name]
    chat = CHATS[case]
    if name == "deepseek_r1_distill_qwen_32b":  # its render never begins with its prompt: said (below), not trained
        assert facts(template, special).unprompted == ("<think>\n", "Hi there.<｜end▁of▁sentence｜>")
        return
    for k, m in enumerate(chat):
        if m["role"] != "assistant":
            continue
        (text,), (spans,) = render([with_reasoning(chat[:k + 1], template)], template, special, name)
        expected = _what_the_model_writes(chat[:k + 1], template, special)
        if name == "qwen3_4b_instruct_2507":
            expected = expected.removeprefix(EMPTY_THINK)
        assert text[spans[-1][0]:spans[-1][1]] == expected
        if k == len(chat) - 1:  # spans (the default) trains the last turn the same way
            assert not text[spans[-1][1]:].strip()


def test_the_same_conversation_has_the_same_labels_in_every_mode_and_for_a_built_in_and_auto(tmp_path):
    """ChatML as the tokenizer's own template (auto) and as the chatml built-in, under spans, per_turn and last: the
    end-of-turn token trains, the line break after it never (it trained under per_turn and auto before #60)."""
    tok = load_tokenizer("builtin:tiny-llama")
    rows = [{"messages": CHATS["plain"]}] * 4
    labelled = set()
    for template in ("auto", "chatml"):
        for mode in ("spans", "per_turn", "last"):
            prepared = _prepared(tmp_path, tok, rows, template=template, multi_turn=mode, overwrite_cache=True)
            for ex in prepared.train:
                runs = _runs(tok, ex)
                labelled.update(runs)
                assert all(r.endswith("<|im_end|>") for r in runs), (template, mode, runs)
    assert labelled == {"Cold.<|im_end|>", "Down.<|im_end|>"}


def _runs(tok, ex) -> list[str]:
    runs, cur = [], []
    for t, label in zip(ex["input_ids"], ex["labels"]):
        if label != -100:
            cur.append(t)
        elif cur:
            runs, cur = runs + [tok.decode(cur)], []
    return runs + ([tok.decode(cur)] if cur else [])


def _prepared(tmp_path, tok, rows, **data):
    """The data step as the driver runs it (test_history_templates' helper), at 512 tokens."""
    from tests.unit.test_history_templates import _prepared as prepared

    return prepared(tmp_path, tok, rows, **{"max_length": 512, **data})


@pytest.mark.parametrize("field", ["reasoning_content", "thinking", "reasoning", "inline"])
def test_every_reasoning_field_users_have_is_read(field, tmp_path):
    """transformers' apply_chat_template takes `thinking` beside `reasoning_content`, vLLM and OpenRouter write
    `reasoning`: each trains the reasoning (it was dropped without a word for `thinking`)."""
    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = _source("qwen3_4b_thinking_2507")
    reply = ({"content": "<think>\nAdd them.\n</think>\n\n4."} if field == "inline"
             else {"content": "4.", field: "Add them."})
    rows = [{"messages": [{"role": "user", "content": f"2+2? ({i})"}, {"role": "assistant", **reply}]}
            for i in range(4)]
    prepared = _prepared(tmp_path, tok, rows)
    assert {_runs(tok, ex)[-1] for ex in prepared.train} == {"Add them.\n</think>\n\n4.<|im_end|>"}


@pytest.mark.parametrize("turn,why", [
    ({"content": "4.", "reasoning_content": 7}, "turn 1 (assistant): 'reasoning_content' is a number, not text"),
    ({"content": "4.", "thinking": "a", "reasoning": "b"}, "'thinking' and 'reasoning' hold different reasoning"),
    ({"content": "<think>a</think>4.", "thinking": "a"}, "reasoning both in 'thinking' and as a think block"),
])
def test_reasoning_of_the_wrong_type_or_given_twice_is_refused_with_its_row(turn, why, tmp_path):
    tok = load_tokenizer("builtin:tiny-llama")
    good = [{"messages": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": "A."}]}
            for i in range(199)]
    bad = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", **turn}]}
    prepared = _prepared(tmp_path, tok, [*good[:100], bad, *good[100:]])
    said = next(n for n in prepared.notes if "skipped 1 record" in n)
    assert why in said and "(line 101)" in said


def test_turns_before_the_last_in_a_history_form_are_said_at_start(tmp_path):
    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = _source("qwen3_4b_thinking_2507")
    rows = [{"messages": CHATS["reasoning"]}] * 3
    note = next(n for n in _prepared(tmp_path, tok, rows).notes if "history form" in n)
    assert ("multi_turn=spans: in 3 conversations the assistant turns before the last train in the template's "
            "history form ('Hi there.<|im_end|>', where the model writes 'Greet back first.\\n</think>\\n\\nHi there."
            "<|im_end|>' after its generation prompt)") in note and "data.multi_turn=per_turn trains each turn" in note
    per_turn = _prepared(tmp_path, tok, rows, multi_turn="per_turn", overwrite_cache=True)
    assert not [n for n in per_turn.notes if "history form" in n]
    tok.chat_template = BUILTIN_TEMPLATES["chatml"]  # writes every turn alike: nothing to say
    assert not [n for n in _prepared(tmp_path, tok, rows, overwrite_cache=True).notes if "history form" in n]


def test_deepseek_r1s_own_template_keeps_the_calls_and_adds_no_line_breaks(tmp_path):
    """R1 with data.template: auto: a call turn (the data's reply is "") is written and trained (R1's template writes
    calls only when the reply is None, and joins the arguments as a string); an answer after reasoning_content is
    trained as R1 writes it, without the "\\n\\n" an inline block would leave; that R1's template trains no reasoning
    is said."""
    template = _source("deepseek_r1_distill_qwen_32b")
    chat = [{"role": "user", "content": "Weather in Paris?"}, _call("Paris"),
            {"role": "tool", "content": '{"temp_c": 21}'},
            {"role": "assistant", "content": "21 C.", "reasoning_content": "The tool said 21."}]
    (text,), (spans,) = render([with_reasoning(chat, template)], template, R1_SPECIAL, "auto", [[WEATHER]])
    assert [text[a:b] for a, b in spans] == [
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```'
        '<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>', "21 C.<｜end▁of▁sentence｜>"]
    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = template
    rows = [{"messages": CHATS["reasoning"]}] * 3
    notes = _prepared(tmp_path, tok, rows).notes
    assert any("writes an assistant turn as 'Hi there.<｜end▁of▁sentence｜>' where its generation prompt writes "
               "'<think>\\n' first" in n and "data.template=deepseek_r1" in n for n in notes)
    assert any("6 assistant turns carry reasoning, and the chat template (tokenizer) writes none" in n and
               "data.template=deepseek_r1 trains the last turn's" in n for n in notes)


def test_gpt_oss_agent_data_trains_under_its_own_template_and_the_advice_works(tmp_path):
    """gpt-oss with data.template: auto: a call turn with reasoning, its result, then the answer: every assistant
    turn trains under spans (it was refused, with per_turn as the advice, and per_turn failed the same way) and under
    per_turn; two calls in one message, of which its template writes only the first, are refused with their row."""
    template = _source("gpt_oss_120b")
    agent = [{"role": "user", "content": "Weather in Paris?"}, _call("Paris", reasoning_content="Ask the tool."),
             {"role": "tool", "content": '{"temp_c": 21}'}, {"role": "assistant", "content": "21 C."}]
    (text,), (spans,) = render([with_reasoning(agent, template)], template, OSS, "auto", [[WEATHER]])
    assert [text[a:b] for a, b in spans] == [
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
        "<|channel|>final<|message|>21 C.<|return|>"]
    (alone,), (first,) = render([with_reasoning(agent[:2], template)], template, OSS, "auto", [[WEATHER]])
    assert alone[first[0][0]:first[0][1]] == _what_the_model_writes(agent[:2], template, OSS, [WEATHER]) == (
        "<|channel|>analysis<|message|>Ask the tool.<|end|><|start|>assistant to=functions.get_weather<|channel|>"
        'commentary json<|message|>{"city": "Paris"}<|call|>')
    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = template
    two = {"messages": [{"role": "user", "content": "Paris and Rome?"}, {"role": "assistant", "content": "",
                        "tool_calls": [*_call("Paris")["tool_calls"], *_call("Rome")["tool_calls"]]},
                        {"role": "tool", "content": "21"}, {"role": "tool", "content": "25"},
                        {"role": "assistant", "content": "21 and 25."}]}
    rows = [{"messages": agent, "tools": [WEATHER]}] * 150 + [{**two, "tools": [WEATHER]}]
    for mode in ("spans", "per_turn"):
        prepared = _prepared(tmp_path, tok, rows, multi_turn=mode, overwrite_cache=True)
        assert len(prepared.train) == (150 if mode == "spans" else 300)
        said = next(n for n in prepared.notes if "skipped 1 record" in n)
        assert "makes several calls, and the chat template writes only the first" in said and "(line 151)" in said


def test_the_gpt_oss_builtin_refuses_a_call_with_both_a_reply_and_reasoning_as_the_real_template_does():
    template = _source("gpt_oss_120b")
    chat = [{"role": "user", "content": "Weather?"}, {**_call("Paris", reasoning_content="Ask."), "content": "Let me."}]
    for source in (template, BUILTIN_TEMPLATES["gpt_oss"]):
        (out,) = render_records([with_reasoning(chat, source)], source, OSS, [[WEATHER]])
        assert isinstance(out, str) and ("both content and thinking" in out or "both a reply and reasoning" in out)


def test_the_gemma3_builtin_keeps_the_system_prompt_as_written():
    chat = [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": " Hi "},
            {"role": "assistant", "content": "Hello."}]
    real, _ = render_jinja_template([chat], chat_template=_source("gemma3_it"), bos_token="<bos>")
    ours, _ = render_jinja_template([chat], chat_template=BUILTIN_TEMPLATES["gemma3"], bos_token="<bos>")
    assert ours == real and "user\n  Be brief. \n\nHi<end_of_turn>" in ours[0]


def test_a_built_in_whose_markers_the_tokenizer_lacks_is_said(tmp_path):
    tok = load_tokenizer("builtin:tiny-llama")  # ChatML markers only
    rows = [{"messages": CHATS["plain"]}] * 3
    note = next(n for n in _prepared(tmp_path, tok, rows, template="llama3").notes if "has no token for" in n)
    assert note.startswith("data.template=llama3: the tokenizer has no token for 3 of its markers (<|start_header_id|>"
                           " -> ") and "they train as plain text" in note
    assert not [n for n in _prepared(tmp_path, tok, rows, template="chatml", overwrite_cache=True).notes
                if "has no token for" in n]


@pytest.mark.parametrize("name", ["qwen3_0_6b", "qwen3_4b_instruct_2507", "llama3_1_instruct", "gpt_oss_120b"])
def test_call_arguments_given_as_a_json_string_train_as_the_models_template_writes_them(name, tmp_path):
    """#72: Qwen3's released templates write an argument string as given (`arguments is string`), so a compact
    '{"city":"paris"}' trains compact, as the model writes it at inference and as apply_chat_template renders the
    same conversation (the data step re-serialised it with spaces before); a template that writes only a mapping
    (Llama 3.1's, gpt-oss's) gets the string parsed, as before, never a quoted string."""
    from scaletrain.data.template_input import writes_string_arguments

    template, special = _source(name), MODELS[name]
    compact = '{"city":"paris"}'
    chat = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": "callparis", "function": {"name": "get_weather", "arguments": compact}}]},
        {"role": "tool", "content": "21"}, {"role": "assistant", "content": "21 C."}]
    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = template
    prepared = _prepared(tmp_path, tok, [{"messages": chat, "tools": [WEATHER]}] * 3)
    trained = "".join(_runs(tok, prepared.train[0]))
    assert "paris" in trained and '\\"city\\"' not in trained  # never a quoted string
    assert writes_string_arguments(template) == name.startswith("qwen3")
    if name.startswith("qwen3"):
        (reference,), _ = render_jinja_template([chat], tools=[WEATHER], chat_template=template, **special)
        assert compact in reference and compact in trained
    else:
        assert compact not in trained


def test_reasoning_under_a_template_without_any_is_said_with_its_count_and_can_be_dropped(tmp_path):
    """#72: Gemma 3's released template has no reasoning: reasoning in the data trains as a <think> block the model's
    template never writes; that is said at start with the count and the choice, and data.reasoning: drop leaves it
    out (the replies then train alone, as the template writes them)."""
    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = _source("gemma3_it")
    rows = [{"messages": CHATS["reasoning"]}] * 3
    kept = _prepared(tmp_path, tok, rows)
    said = next(n for n in kept.notes if "assistant turns carry reasoning" in n)
    assert "6 assistant turns carry reasoning, and the chat template (tokenizer) has no reasoning of its own" in said
    assert "data.reasoning: drop leaves it out" in said
    assert any("<think>" in run for run in _runs(tok, kept.train[0]))
    dropped = _prepared(tmp_path, tok, rows, reasoning="drop", overwrite_cache=True)
    assert any("6 assistant turns carry reasoning: left out of every turn (data.reasoning: drop)" in n
               for n in dropped.notes)
    runs = _runs(tok, dropped.train[0])
    assert not any("think" in run or "Add them" in run for run in runs) and any("12." in run for run in runs)
