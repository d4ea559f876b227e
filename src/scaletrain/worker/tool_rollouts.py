"""Multi-turn tool rollouts (#74, ``rl.tools`` / ``rl.environment``): after the engine's first turn, each completion
that called tools gets their answers (rl/tools.py) in its context and is sampled again, until it calls none,
``rl.max_tool_calling_iterations`` rounds were made, or its tokens reach ``rl.max_completion_length`` (TRL 1.13's
``_tool_call_loop``: a round whose tool replies would pass the budget is not made, and the completion ends as it
is). A completion is then its turns' tokens and the tool replies' between them; the replies' tokens are in the
context and out of the loss (``trained`` 0), the sampled tokens in it.

Every round of every row draws from a random stream of its own (its first turn's seed and the round: ``turn_seed``),
so the rounds' tokens do not depend on which other rows share the batch: 1 and N workers sample the same
conversations. Under a sharded policy (FSDP) the ranks sample together: every rank takes part in a round while any
rank has a row to continue (a rank with none samples one row again and drops it). With ``rollout.max_staleness`` >
0 the first turn is sampled ahead, the later rounds when the step collects it (by the weights then synced; each
token's own sampling log-probability is kept, so the correction weighs every token by the policy that drew it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from scaletrain.data.template_input import template_variables
from scaletrain.data.templates import resolve_template
from scaletrain.data.tools import Tools
from scaletrain.rl.sampling import left_padded
from scaletrain.rl.tools import Suffixes, answer, call_format, environments_for, parse_calls


def turn_seed(seed: int, turn: int) -> int:
    """The random stream of a row's ``turn``-th round (turn 0 is its first: its own seed)."""
    if turn == 0:
        return seed
    digest = hashlib.sha256(f"{seed}:turn:{turn}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


@dataclass
class Conversation:
    """One completion: its tokens after the prompt, each one's sampling log-probability (0 for a tool reply's),
    whether it trains (1: sampled, 0: a tool reply's), and its turns as messages (TRL's conversational
    completion: assistant turns with their ``tool_calls``, and the ``tool`` replies)."""

    prompt: list[int]
    seed: int
    tokens: list[int]
    logps: list[float]
    truncated: bool
    trained: list[int] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)  # the last turn's, to answer

    def __post_init__(self):
        if not self.trained:
            self.trained = [1] * len(self.tokens)


@dataclass
class Counts:
    calls: int = 0
    failures: int = 0


class ToolRollouts:
    """The run's tools, how its template writes a call, and the loop (see the module docstring)."""

    def __init__(self, cfg, tokenizer, tools: Tools):
        self.tools = tools
        _, template = resolve_template(cfg.data.template, tokenizer)
        self.format = call_format(template)
        self.tokenizer, self.stop = tokenizer, tokenizer.eos_token_id
        self.suffixes = Suffixes(tokenizer, template, template_variables(tokenizer, cfg.data.enable_thinking),
                                 self.stop)
        self.cap = cfg.rl.max_completion_length
        self.rounds = cfg.rl.max_tool_calling_iterations

    def _read(self, c: Conversation, turn: list[int]) -> None:
        """A sampled turn's message and calls (its stop token is not text of it)."""
        ids = turn[:-1] if turn and turn[-1] == self.stop else turn
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        content, calls = parse_calls(text, self.format)
        c.messages.append({"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
                          if calls else {"role": "assistant", "content": text})
        c.calls = calls if turn and turn[-1] == self.stop else []  # a turn cut at the budget calls nothing

    def converse(self, engine, how: dict, rows: list[Conversation], extras: list[dict], together=None
                 ) -> tuple[list | None, Counts]:
        """``rows`` (their first turns sampled) continued through their tool calls, in place; the environments
        (one per row, or None) and the calls made. ``together``: under a sharded policy, the sum over the ranks
        (every rank samples each round)."""
        envs = environments_for(self.tools, extras)
        counts = Counts()
        for c in rows:
            self._read(c, c.tokens)
        rounds = 0
        while self.rounds is None or rounds < self.rounds:
            going, suffixes = [], []
            for i, c in enumerate(rows):
                if not c.calls:
                    continue
                replies = answer(c.calls, self.tools.functions, envs[i] if envs else None)
                counts.calls += replies.calls
                counts.failures += replies.failures
                suffix = self.suffixes(replies.messages)
                c.calls = []
                if len(c.tokens) + len(suffix) >= self.cap:  # no room for the replies and a token after them
                    continue
                c.messages += replies.messages
                going.append(i)
                suffixes.append(suffix)
            anyone = together([float(len(going))])[0] if together is not None else len(going)
            if not anyone:
                break
            rounds += 1
            self._round(engine, how, rows, going, suffixes, rounds, together is not None)
        return envs, counts

    def _round(self, engine, how: dict, rows: list[Conversation], going: list[int], suffixes: list[list[int]],
               turn: int, collective: bool) -> None:
        """One round: the rows in ``going`` sampled again after their tool replies (each within its budget)."""
        contexts = [rows[i].prompt + rows[i].tokens + s for i, s in zip(going, suffixes)]
        seeds = [turn_seed(rows[i].seed, turn) for i in going]
        if not going:  # a rank with nothing to continue, beside ranks that have: one row again, dropped
            contexts, seeds = [rows[0].prompt + rows[0].tokens], [0]
        room = [self.cap - len(rows[i].tokens) - len(s) for i, s in zip(going, suffixes)]
        ids, mask = left_padded(contexts, how["pad"])
        # a sharded policy's ranks run the same number of forwards: every rank asks for the whole budget
        asked = self.cap if collective or not room else max(room)
        out, sampled = engine.generate(ids, mask, seeds, **{**how, "max_new_tokens": asked})
        for k, (i, s) in enumerate(zip(going, suffixes)):
            row, c = out[k].tolist(), rows[i]
            ended = self.stop in row[:room[k]]
            new = row[:row.index(self.stop) + 1] if ended else row[:room[k]]
            c.tokens += s + new
            c.logps += [0.0] * len(s) + sampled[k, :len(new)].float().cpu().tolist()
            c.trained += [0] * len(s) + [1] * len(new)
            c.truncated = not ended
            self._read(c, new)


def trained_mask(rows: list[Conversation], width: int, mask_truncated: bool) -> torch.Tensor:
    """[rows, width]: 1 on each completion's sampled tokens (0 on tool replies, padding, and a truncated
    completion's when ``mask_truncated``)."""
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, c in enumerate(rows):
        if not (c.truncated and mask_truncated):
            out[i, :len(c.trained)] = torch.tensor(c.trained, dtype=torch.float32)
    return out
