"""#74 item 3: multi-turn tool rollouts with TRL's interface (rl.tools, rl.environment,
rl.max_tool_calling_iterations). A scripted engine answers as a model that calls a calculator would; the prompt
(prepared by the data step), the tool reply and the turns after it are the released Qwen3 template's rendering of the
whole conversation token for token; the tool reply's tokens are out of the loss exactly where the SFT path's labels
of the same conversation leave them out; a tool that raises answers with its error text (TRL's) and is counted."""

import json
from pathlib import Path

import pytest
import torch

from scaletrain.config import validate
from scaletrain.data import IGNORE_INDEX, prepare_data
from scaletrain.errors import ConfigError, TrainingError
from scaletrain.model.tokenizer import load_tokenizer
from scaletrain.rl.tools import answer, call_format, parse_calls
from scaletrain.worker.tool_rollouts import Conversation, ToolRollouts, trained_mask, turn_seed
from tests.tool_model import TOOLS

REAL = Path(__file__).parents[1] / "fixtures" / "chat_templates"

DIVIDE = '''

def divide(a: int, b: int) -> float:
    """Divides a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b
'''

USER = {"role": "user", "content": "What is 2+3?"}
CALL = {"role": "assistant", "content": "<think>\nI add.\n</think>\n\n",
        "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}
FINAL = {"role": "assistant", "content": "<think>\nThe tool said 5.\n</think>\n\nIt is 5."}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """builtin:tiny-llama's vocabulary under Qwen3's released template, its end of turn the end of sequence (as
    Qwen3's own tokenizer has it)."""
    from transformers import AutoTokenizer

    d = tmp_path_factory.mktemp("qwen3tools")
    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = (REAL / "qwen3_0_6b.jinja").read_text()
    tok.eos_token = "<|im_end|>"
    tok.save_pretrained(str(d))
    (d / "calc.py").write_text(TOOLS + DIVIDE)  # tests/tool_model.py's add, vowels and Counter, and divide
    return AutoTokenizer.from_pretrained(str(d), local_files_only=True), d


def _cfg(d: Path, data: Path, **rl) -> object:
    return validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                     "train": {"stage": "grpo", "per_device_train_batch_size": 2},
                     "data": {"train_file": str(data), "formatting": "messages", "eval_ratio": 0.0, "max_length": 4096,
                              "template": str(REAL / "qwen3_0_6b.jinja")},
                     "rl": {"num_generations": 2, "max_completion_length": 256, "reward_funcs": ["accuracy"], **rl},
                     "output": {"output_dir": str(d / "runs")}})


class Scripted:
    """An engine that answers every row with the next assistant turn of ``turns`` (by how many tool replies its
    context holds), each row's tokens as the tokenizer writes the turn, then the end of turn."""

    def __init__(self, tok, turns: list[str]):
        self.tok, self.turns, self.asked = tok, turns, []

    def generate(self, ids, mask, seeds, max_new_tokens, eos, pad, **_):
        self.asked.append(list(seeds))
        rows = []
        for row, m in zip(ids, mask):
            text = self.tok.decode(row[m.bool()].tolist())
            rows.append(self.tok(self.turns[text.count("<tool_response>")], add_special_tokens=False)["input_ids"]
                        + [eos])
        width = max(len(r) for r in rows)
        out = torch.full((len(rows), width), pad)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r)
        return out, torch.full(out.shape, -0.5)


def _first(tok, engine, prompt: list[int], seed: int) -> Conversation:
    ids, mask = torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long)
    out, logps = engine.generate(ids, mask, [seed], 256, tok.eos_token_id, tok.pad_token_id)
    row = out[0].tolist()
    row = row[:row.index(tok.eos_token_id) + 1]
    return Conversation(prompt, seed, row, logps[0, :len(row)].tolist(), False)


def test_a_calculator_rollout_is_qwen3s_rendering_and_its_reply_is_out_of_the_loss(tmp_path, qwen3):
    tok, d = qwen3
    data = tmp_path / "sums.jsonl"
    data.write_text(json.dumps({"prompt": [USER], "answer": "5"}) + "\n")
    cfg = _cfg(d, data, tools=[f"{d / 'calc.py'}:add", f"{d / 'calc.py'}:divide"])
    prepared = prepare_data(cfg, tok)
    prompt = prepared.train[0]["input_ids"]
    from scaletrain.data.tools import load_tools

    tools = load_tools(cfg.rl)
    schemas = [s["function"]["name"] for s in tools.schemas]
    assert schemas == ["add", "divide"]
    # the data step declares the tools as the template does (transformers' apply_chat_template, the reference)
    assert prompt == tok.apply_chat_template([USER], tools=tools.schemas, add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]

    full = tok.apply_chat_template([USER, CALL, {"role": "tool", "name": "add", "content": "5"}, FINAL],
                                   tools=tools.schemas, tokenize=False)
    turns = [full.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0],
             full.split("<|im_start|>assistant\n")[2].split("<|im_end|>")[0]]
    engine = Scripted(tok, turns)
    rollouts = ToolRollouts(cfg, tok, tools)
    c = _first(tok, engine, prompt, seed=7)
    how = {"max_new_tokens": 256, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    envs, counts = rollouts.converse(engine, how, [c], [{"prompt": [USER], "columns": {"answer": "5"}}])
    assert envs is None and (counts.calls, counts.failures) == (1, 0)
    # prompt + turn + the tool's reply + the next turn: the template's rendering of the whole conversation
    assert prompt + c.tokens == tok(full.rstrip("\n"), add_special_tokens=False)["input_ids"]
    assert engine.asked == [[7], [turn_seed(7, 1)]] and turn_seed(7, 1) != 7
    # TRL's conversational completion: the call, the tool's reply, the answer
    assert [m["role"] for m in c.messages] == ["assistant", "tool", "assistant"]
    assert c.messages[0]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert c.messages[1]["content"] == "5" and c.messages[2]["content"].endswith("It is 5.")
    # the tool reply's tokens are out of the loss: exactly where the SFT path's labels of the same conversation
    # (the data step as it prepares a tool conversation to train on) leave the tokens after the prompt out
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"messages": [USER, CALL, {"role": "tool", "content": "5"}, FINAL],
                               "tools": json.dumps(tools.schemas)}) + "\n")
    sft_cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                        "data": {"train_file": str(sft), "formatting": "messages", "eval_ratio": 0.0,
                                 "max_length": 4096, "template": str(REAL / "qwen3_0_6b.jinja")},
                        "output": {"output_dir": str(tmp_path / "sft-runs")}})
    example = prepare_data(sft_cfg, tok).train[0]
    assert example["input_ids"][:len(prompt) + len(c.tokens)] == prompt + c.tokens
    labelled = [int(y != IGNORE_INDEX) for y in example["labels"][len(prompt):len(prompt) + len(c.tokens)]]
    mask = trained_mask([c], len(c.tokens), mask_truncated=False)[0].int().tolist()
    assert mask == labelled and 0 in mask
    reply = tok.decode([t for t, m in zip(c.tokens, mask) if m == 0])
    assert "<tool_response>\n5\n</tool_response>" in reply and "It is" not in reply
    # the sampler's log-probabilities kept for the sampled tokens, 0 for the reply's
    assert [lp for lp, m in zip(c.logps, mask) if m == 0] == [0.0] * mask.count(0)


def test_a_tool_that_raises_answers_with_its_error_and_rounds_stop_at_the_limit(tmp_path, qwen3):
    tok, d = qwen3
    from scaletrain.data.tools import load_tools

    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"prompt": [USER], "answer": "5"}) + "\n")
    cfg = _cfg(d, data, tools=[f"{d / 'calc.py'}:divide"], max_tool_calling_iterations=2)
    tools = load_tools(cfg.rl)
    got = answer([{"type": "function", "function": {"name": "divide", "arguments": {"a": 1, "b": 0}}},
                  {"type": "function", "function": {"name": "nope", "arguments": {}}}], tools.functions)
    assert got.failures == 2 and got.messages[0] == {"role": "tool", "name": "divide",
                                                     "content": "{'error': 'division by zero'}"}
    assert got.messages[1]["content"] == "{'error': 'Tool nope not found.'}"  # TRL's words
    # a model that calls forever: rl.max_tool_calling_iterations rounds, then the completion ends as it is
    call = '<tool_call>\n{"name": "divide", "arguments": {"a": 1, "b": 0}}\n</tool_call>'
    engine = Scripted(tok, [call] * 10)
    prompt = tok.apply_chat_template([USER], tools=tools.schemas, add_generation_prompt=True, tokenize=True,
                                     return_dict=True)["input_ids"]
    c = _first(tok, engine, prompt, seed=1)
    how = {"max_new_tokens": 256, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    _, counts = ToolRollouts(cfg, tok, tools).converse(engine, how, [c], [{"prompt": [USER], "columns": {}}])
    assert len(engine.asked) == 3 and (counts.calls, counts.failures) == (2, 2)
    assert tok.decode(c.tokens).count("division by zero") == 2
    # the budget: a completion whose reply would pass rl.max_completion_length ends before it (TRL's)
    engine = Scripted(tok, [call] * 10)
    c = _first(tok, engine, prompt, seed=1)
    short = _cfg(d, data, tools=[f"{d / 'calc.py'}:divide"], max_completion_length=len(c.tokens) + 5)
    ToolRollouts(short, tok, tools).converse(engine, how, [c], [{"prompt": [USER], "columns": {}}])
    assert len(engine.asked) == 1 and set(c.trained) == {1} and len(c.tokens) + 5 == short.rl.max_completion_length


def test_an_environment_is_reset_per_completion_its_methods_are_tools_and_it_owns_a_reward(tmp_path, qwen3):
    tok, d = qwen3
    from scaletrain.data.tools import load_tools
    from scaletrain.worker.grpo import environment_reward

    data = tmp_path / "g.jsonl"
    data.write_text(json.dumps({"prompt": [USER], "answer": "4"}) + "\n")
    cfg = _cfg(d, data, environment=f"{d / 'calc.py'}:Counter", reward_funcs=[])
    tools = load_tools(cfg.rl)
    assert [s["function"]["name"] for s in tools.schemas] == ["guess"] and tools.owns_reward
    turns = ['<tool_call>\n{"name": "guess", "arguments": {"n": 3}}\n</tool_call>',
             '<tool_call>\n{"name": "guess", "arguments": {"n": 4}}\n</tool_call>', "Found it."]
    prompt = tok.apply_chat_template([USER], tools=tools.schemas, add_generation_prompt=True, tokenize=True,
                                     return_dict=True)["input_ids"]
    rows = [_first(tok, Scripted(tok, turns), prompt, seed=s) for s in (1, 2)]
    engine = Scripted(tok, turns)
    how = {"max_new_tokens": 256, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    extras = [{"prompt": [USER], "columns": {"answer": "4"}}, {"prompt": [USER], "columns": {"answer": "9"}}]
    from scaletrain.rl.rewards import check

    said = check(cfg)  # what the run says at its start
    assert "rewards Counter.get_reward x 1; tools guess, up to any number of round(s) of calls, their replies " \
        "out of the loss" in said
    envs, counts = ToolRollouts(cfg, tok, tools).converse(engine, how, rows, extras)
    assert [e.guesses for e in envs] == [2, 2] and envs[0] is not envs[1] and counts.calls == 4
    assert "higher" in tok.decode(rows[0].tokens) and "right" in tok.decode(rows[0].tokens)
    assert environment_reward(envs) == [1.0, 0.0]


def test_call_forms_are_read_from_the_template_and_bad_tools_are_one_line(tmp_path, qwen3):
    _, d = qwen3
    assert call_format((REAL / "qwen3_0_6b.jinja").read_text()) == "hermes"
    assert call_format((REAL / "qwen2_5_instruct.jinja").read_text()) == "hermes"
    assert call_format((REAL / "mistral_7b_instruct_v0_3.jinja").read_text()) == "mistral"
    assert call_format((REAL / "llama3_1_instruct.jinja").read_text()) == "llama_json"
    with pytest.raises(ConfigError, match="does not read yet"):
        call_format((REAL / "gpt_oss_120b.jinja").read_text())
    assert parse_calls('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}]', "mistral")[1][0]["function"] == \
        {"name": "add", "arguments": {"a": 1}}
    assert parse_calls('{"name": "add", "parameters": {"a": 1}}', "llama_json")[1][0]["function"]["name"] == "add"
    assert parse_calls("<tool_call>\n{not json}\n</tool_call>", "hermes")[1] == []  # no call (TRL's)
    from scaletrain.data.tools import load_tools

    bad = tmp_path / "bad.py"
    bad.write_text("def f(a, b):\n    return a\n\nclass NoReset:\n    def go(self, n: int) -> int:\n"
                   "        '''Go.\n\n        Args:\n            n: how far.\n        '''\n        return n\n")
    data = tmp_path / "x.jsonl"
    data.write_text(json.dumps({"prompt": [USER]}) + "\n")
    with pytest.raises(ConfigError, match=r"rl.tools: .*bad.py:f: no schema .* type hint"):
        load_tools(_cfg(d, data, tools=[f"{bad}:f"]).rl)
    with pytest.raises(ConfigError, match="has no reset method"):
        load_tools(_cfg(d, data, environment=f"{bad}:NoReset").rl)
    with pytest.raises(ConfigError, match="has no 'missing'"):
        load_tools(_cfg(d, data, tools=[f"{bad}:missing"]).rl)
    with pytest.raises(Exception, match="not supported yet; use train.stage: grpo"):
        validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                  "train": {"stage": "distill"}, "data": {"train_file": str(data)},
                  "rl": {"teacher_model": "builtin:tiny-llama", "tools": [f"{bad}:f"]}})
    # an environment that returns text from reset is one line (prompts are rendered in the data step)
    from scaletrain.rl.tools import environments_for

    talky = tmp_path / "talky.py"
    talky.write_text(TOOLS.replace("self.answer, self.guesses, self.last = int(answer), 0, None", "return 'hello'"))
    with pytest.raises(TrainingError, match="reset returned text"):
        environments_for(load_tools(_cfg(d, data, environment=f"{talky}:Counter").rl),
                         [{"prompt": [USER], "columns": {"answer": "1"}}])
