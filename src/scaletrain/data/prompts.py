"""Prompts for train.stage: grpo: what the policy is asked, rendered as the model sees it when it answers, and the
columns its rewards read.

TRL's prompt-only format: a ``prompt`` column (``rl.prompt_column``), text or a list of messages (rendered through
the chat template with its generation prompt; text is taken as written, as TRL takes it); every other column goes to
the reward functions. LLaMA-Factory's alpaca / sharegpt / messages rows: the conversation before its last reply is
the prompt, and that reply is the reference answer (``rl.answer_column``). A prompt longer than data.max_length
tokens is skipped and counted (the completion budget is rl.max_completion_length on top of it).

Each prompt is one row here; prepare.py repeats it ``rl.num_generations`` times (a group: consecutive rows, kept
together by the sampler) with its index, which seeds its completions (worker/grpo.py).
"""

from __future__ import annotations

import json

from scaletrain.data.encode import IGNORE_INDEX
from scaletrain.data.formats import Columns, to_conversation
from scaletrain.data.template_input import template_variables, with_reasoning

EXTRA = "extra"  # JSON: the prompt as the data gives it and the columns the rewards read


def encode_prompts(batch: dict[str, list], tokenizer, formatting: str, columns: Columns, template: str,
                   prompt_column: str, answer_column: str, max_length: int,
                   enable_thinking: bool | None = None, tools: list[dict] | None = None) -> dict[str, list]:
    """``tools``: the schemas a tool run declares (data/tools.py), rendered by the template as it renders them."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    ids, skip, full, extra = [], [], [], []
    variables = template_variables(tokenizer, enable_thinking)
    for row in rows:
        prompt, others, why = _prompt(row, formatting, columns, prompt_column, answer_column)
        text = ""
        if not why and tools and not isinstance(prompt, list):
            why = ("the prompt is text and rl.tools / rl.environment declare tools through the chat template; give "
                   "the prompt as a list of messages")
        if not why and isinstance(prompt, list):
            try:
                (text,), _ = render_jinja_template([with_reasoning(prompt, template)], chat_template=template,
                                                   add_generation_prompt=True, tools=tools or None, **variables)
            except Exception as e:  # noqa: BLE001 - the template's own refusal, in its words
                why = f"the chat template cannot render it: {e}"
        elif not why:
            text = prompt
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        if not why and len(tokens) > max_length:
            why = (f"the prompt has {len(tokens)} tokens, more than data.max_length={max_length} (the prompt's "
                   f"budget; completions get rl.max_completion_length on top)")
        skip.append(why)
        ids.append(tokens if not why else [])
        full.append(len(tokens))
        extra.append(json.dumps({"prompt": prompt, "columns": others}, ensure_ascii=False, default=str))
    # no label: a prompt's completions are sampled, and their loss is GRPO's (worker/grpo.py)
    return {"input_ids": ids, "labels": [[IGNORE_INDEX] * len(x) for x in ids], "_skip": skip, "_full": full,
            EXTRA: extra}


def _prompt(row: dict, formatting: str, columns: Columns, prompt_column: str, answer_column: str):
    """(the prompt: text or messages, the reward columns, why the row is skipped or "")."""
    if prompt_column in row:
        prompt = row[prompt_column]
        others = {k: v for k, v in row.items() if k != prompt_column}
        if isinstance(prompt, str) and prompt.strip():
            return prompt, others, ""
        if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
            return prompt, others, ""
        return None, others, f"'{prompt_column}' is neither text nor a list of messages"
    chat, why = to_conversation(row, formatting, columns)
    if chat is None:
        return None, {}, why
    messages = chat.messages
    reply = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else None
    prompt = messages[:-1] if reply is not None else messages
    if not prompt or prompt[-1]["role"] != "user":
        return None, {}, "the conversation has no user turn before its last reply to ask"
    others = {k: v for k, v in row.items() if not isinstance(v, (list, dict))}
    if reply is not None:
        others[answer_column] = reply
    return [{k: v for k, v in m.items() if k in ("role", "content")} for m in prompt], others, ""


def groups(ds, num_generations: int):
    """Each prompt ``num_generations`` times in a row (a group: its completions' rows), with the prompt's index in
    the split (it seeds the group's sampling: the same completions on any number of workers) and the row's place
    in the group."""

    def repeat(batch: dict, indices: list[int]) -> dict:
        out = {k: [v for v in values for _ in range(num_generations)] for k, values in batch.items()}
        out["prompt_index"] = [i for i in indices for _ in range(num_generations)]
        out["generation"] = [g for _ in indices for g in range(num_generations)]
        return out

    return ds.map(repeat, batched=True, with_indices=True, keep_in_memory=True, desc=None)
