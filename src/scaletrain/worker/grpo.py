"""train.stage: grpo: one optimizer step of GRPO (and its variants). The rollout engine (worker/rollout.py,
worker/vllm_engine.py) samples with the policy being trained (hf, colocated), in Ray actors of their own given the
policy by a versioned weight sync (separate), or with vLLM; ``_sync`` keeps an engine that holds weights of its own
at the last optimizer step's policy.

Each step (``begin_step``, before the micro-batches' forwards): every prompt of this rank's accumulation window is
answered ``rl.num_generations`` times (its group, one row each), each row drawn from a random stream of its own (the
run's seed, the step, the prompt's index in the split and the row's place in its group: rl/sampling.py; the same
completions on 1 worker or N, and on a resumed run); the rewards
of every completion are computed (rl/rewards.py), gathered from every rank and turned into advantages over the whole
step (rl/advantages.py: every rank computes the same numbers), and the step's normalisers (completions, completion
tokens) are summed over every rank. With ``rl.beta`` > 0 the reference's log-probabilities of the completions come
from the base with the adapter off (LoRA) or the frozen copy. Then each micro-batch's loss (``micro_loss``) is
rl/loss.py's per-token loss over its completion tokens, its share of the global normalisation x world size (DDP
averages gradients over ranks). A completion is its tokens through the first end-of-sequence token; one that reaches
``rl.max_completion_length`` without it is truncated (``rl.mask_truncated_completions`` leaves it out of the loss).
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import TYPE_CHECKING

import torch

from scaletrain.data.tools import load_tools
from scaletrain.rl import loss as rl_loss
from scaletrain.rl import rewards as rl_rewards
from scaletrain.rl.advantages import advantages
from scaletrain.rl.unscored import Unscored
from scaletrain.worker.async_rollouts import InFlight, ahead_of_time
from scaletrain.worker.completions import completion_batch, completion_logps, first_turns, request_for
from scaletrain.worker.parallel import all_gather_floats, all_reduce_sum, unwrap
from scaletrain.worker.rollout import Colocated, RolloutPool, all_done_for, start_engine, sync_engine
from scaletrain.worker.tool_rollouts import ToolRollouts

if TYPE_CHECKING:
    from scaletrain.config.schema import Config, TrainConfig
    from scaletrain.worker.trainer import Trainer
    from scaletrain.worker.vllm_engine import VLLMEngine


log = logging.getLogger(__name__)


class GRPOObjective:
    """worker/objective.py's ``Objective`` for ``train.stage: grpo``."""

    def __init__(self, cfg: Config):
        self.cfg, self.rl = cfg, cfg.rl
        self.specs = list(cfg.rl.reward_funcs)
        self.names = [rl_rewards.name_of(s) for s in self.specs]
        self.funcs = [rl_rewards.load(s) for s in self.specs]
        weights = list(cfg.rl.reward_weights or [1.0] * len(self.specs))
        self.tools = load_tools(cfg.rl)  # rl.tools / rl.environment (worker/tool_rollouts.py)
        if self.tools is not None and self.tools.owns_reward:  # TRL's: the environment's get_reward, weight 1
            self.specs.append(f"{cfg.rl.environment}.get_reward")
            self.names.append(self.tools.environment.__name__)
            self.funcs.append(environment_reward)
            weights.append(1.0)
        self.weights = torch.tensor(weights, dtype=torch.float64)
        # each function's sums under rewards/: a function may be called "length" (the built-in), as a stat is
        per_func = [f"rewards/{n}{suffix}" for n in self.names for suffix in ("", "_sq", "_n")]
        self.stats = ("reward", "reward_sq", "reward_n", *per_func, "length", "truncated", "completions", "kl",
                      "entropy", "tokens", "clip_low", "clip_high", "clip_count", "logp_diff", "steps", "rollout_s",
                      "reference_s", "sync_s", "is_sum", "is_n", "lag_sum", "lag_n", "stale_dropped", "tool_calls",
                      "tool_failures")
        self.totals: rl_loss.Totals | None = None
        self.tokenizer = None
        self.engine: Colocated | RolloutPool | None = None  # worker/rollout.py, made at the first rollout
        self.sync_mb: float | None = None  # the last weight sync's payload (separate engine)
        self.buffer: dict | None = None  # rl.num_iterations > 1: the generation's batches, trained on mu steps
        self.world = 1  # the ranks whose sums the records get
        self.unscored = Unscored(self.names, cfg.rl.num_generations, cfg.monitor.alerts.unscored_steps)
        # asynchronous GRPO (worker/async_rollouts.py): the next steps' rollouts sampled while this one trains
        self.staleness = cfg.rollout.max_staleness
        self.inflight = InFlight()
        # TRL's correction where the sampler is not the trainer: vLLM's kernels, or a stale policy (rl/loss.py)
        self.corrects = cfg.rl.vllm_importance_sampling_correction and (
            cfg.rollout.engine == "vllm" or self.staleness > 0)
        self.extremes = [math.inf, -math.inf, 0.0]  # this rank's IS ratio min, max and lag max since the last record
        self.device = "cpu"
        self.conversing: ToolRollouts | None = None  # rl.tools / rl.environment: made with the tokenizer

    def holds_reference(self, train: TrainConfig, lora: bool) -> bool:
        return self.rl.beta > 0 and not lora

    def prepare(self, t: Trainer, splits: dict, collate) -> dict:
        return splits

    @torch.no_grad()
    def evaluate(self, t: Trainer, data, collate) -> dict[str, float]:
        """The held-out prompts (the eval split: data.eval_ratio or data.eval_file), each answered
        ``rl.num_generations`` times and rewarded, nothing trained: ``eval/reward`` (the weighted sum's mean, as the
        train records' ``reward``), ``eval/rewards/<function>``, ``eval/completions/mean_length`` and the share
        truncated. Every evaluation draws from the same random streams (step 0's, which training never uses), so
        two evaluations differ by the policy only. Whole groups are dealt to the ranks in batches, the same number
        of batches on each (a sharded policy samples collectively)."""
        if len(data) == 0:
            return {}
        self._ensure_tokenizer()
        g, ctx = self.rl.num_generations, t.ctx
        size = max(g, t.cfg.train.per_device_eval_batch_size // g * g)  # whole groups: row i is generation i % g
        batches = [list(range(s, min(s + size, len(data)))) for s in range(0, len(data), size)]
        mine = batches[ctx.dp_rank::ctx.dp_size]
        rounds = math.ceil(len(batches) / ctx.dp_size)
        policy = unwrap(t.model)
        was_training = policy.training
        policy.eval()
        if self.inflight.pending:  # the rollouts sent ahead finish before this evaluation's sync (async_rollouts.py)
            self.inflight.collect_all(self._engine(t))
        self._sync(t, count=False)
        n = len(self.specs)
        sums = [0.0] * (2 * n + 5)  # reward sum, reward n, per function (sum, n), length, truncated, completions
        for k in range(rounds):
            rows = mine[k] if k < len(mine) else batches[0]  # a rank out of batches samples one again, unweighted
            weight = 1.0 if k < len(mine) else 0.0
            r = self._sample(t, collate([data[i] for i in rows]), 0, count=False)
            rewards = self._rewards(t, r)
            total = (rewards * self.weights.unsqueeze(0)).nansum(dim=1)
            total[torch.isnan(rewards).all(dim=1)] = math.nan
            ok = total[~torch.isnan(total)]
            sums[0] += weight * float(ok.sum())
            sums[1] += weight * ok.numel()
            for j in range(n):
                col = rewards[:, j][~torch.isnan(rewards[:, j])]
                sums[2 + 2 * j] += weight * float(col.sum())
                sums[3 + 2 * j] += weight * col.numel()
            sums[-3] += weight * sum(len(c) for c in r["completion_ids"])
            sums[-2] += weight * sum(r["truncated"])
            sums[-1] += weight * len(r["completion_ids"])
        policy.train(was_training)
        sums = all_reduce_sum(sums, ctx.device)
        out = {"eval/reward": sums[0] / max(sums[1], 1.0),
               "eval/completions/mean_length": sums[-3] / max(sums[-1], 1.0),
               "eval/completions/truncated_pct": 100.0 * sums[-2] / max(sums[-1], 1.0),
               "eval/completions": sums[-1]}
        for j, name in enumerate(self.names):
            out[f"eval/rewards/{name}"] = sums[2 + 2 * j] / max(sums[3 + 2 * j], 1.0)
        return out

    def _ensure_tokenizer(self) -> None:
        if self.tokenizer is None:
            from scaletrain.model.tokenizer import load_tokenizer

            self.tokenizer = load_tokenizer(self.cfg.model.name_or_path)
            if self.rl.tools or self.rl.environment:
                self.conversing = ToolRollouts(self.cfg, self.tokenizer, self.tools)

    def _add(self, t: Trainer, name: str, value: float) -> None:
        t.objective_sums[self.stats.index(name)] += value

    # -- the rollout and the rewards of a step --------------------------------------------------------------

    def begin_step(self, t: Trainer, window: list[dict], step: int) -> list[dict]:
        """The window's prompts answered, rewarded and turned into completion batches (see the module docstring).
        With ``rl.num_iterations`` = mu > 1 the window is answered at the first step of each mu (the sampler gives
        the same prompts mu steps in a row) and the batches, with the sampling policy's log-probabilities (the
        importance ratio's denominator), are trained on again at the next mu - 1 steps."""
        self._ensure_tokenizer()
        self.world = t.ctx.world_size
        mu = self.rl.num_iterations
        first = step - (step - 1) % mu  # the step that generates this step's batches
        if mu > 1 and step != first and self.buffer is not None and self.buffer["step"] == first:
            self._add(t, "steps", 1.0)
            self.totals = rl_loss.Totals(*self.buffer["totals"])
            return [dict(b) for b in self.buffer["batches"]]
        if step != first:  # a resume onto another world size mid-generation: the ranks' batches were not kept
            log.warning("step %d: the rollouts of step %d are not in the checkpoint (another world size); this "
                        "step samples its own", step, first)
        out = self._generate(t, window, step, ahead_of_time(self, t, window, step) if self.staleness else None)
        if mu > 1:
            t0 = time.perf_counter()
            for b in out:  # the policy that sampled them: π_old of the mu steps
                b["old_logps"] = self._policy_logps(t, b).cpu()
            self._add(t, "reference_s", time.perf_counter() - t0)
            self.buffer = {"step": step, "batches": out, "totals": (self.totals.sequences, self.totals.tokens)}
        return out

    def state_dict(self) -> dict:
        """This rank's batches of the current generation (rl.num_iterations > 1) and the rollouts it sent ahead
        (rollout.max_staleness > 0: waited for here), for the checkpoint: a run resumed between two of its steps
        trains on them as the uninterrupted run does."""
        return {"buffer": self.buffer, "unscored": self.unscored.state_dict(),
                "inflight": self.inflight.state_dict(self.engine)}

    def load_state_dict(self, state: dict) -> None:
        self.buffer = state.get("buffer")
        self.unscored.load_state_dict(state.get("unscored", {}))
        self.inflight.load_state_dict(state.get("inflight") or {})

    def _generate(self, t: Trainer, window: list[dict], step: int, rollouts: list[dict] | None = None) -> list[dict]:
        """The window's rollouts (sampled now, or ``rollouts``: an asynchronous run's, sampled ahead) rewarded and
        made the step's completion batches."""
        rollouts = self._rolled(t, window, step, rollouts)
        rewards = [self._rewards(t, r) for r in rollouts]
        if t.ctx.is_main and step in (1, t.spec.total_steps):  # what the run's report shows at its start and end
            self._write_samples(t, rollouts[0], rewards[0], step)
        local = torch.cat(rewards) if rewards else torch.empty(0, len(self.specs), dtype=torch.float64)
        gathered = all_gather_floats(local.flatten().tolist(), t.ctx.device)
        everyone = torch.tensor([v for rank in gathered for v in rank], dtype=torch.float64).view(-1, len(self.specs))
        self._judge(t, everyone, step)
        adv, _ = advantages(everyone, self.weights, self.rl.num_generations, self.rl.scale_rewards)
        start = t.ctx.dp_rank * local.shape[0]
        mine = adv[start:start + local.shape[0]]
        self._reward_stats(t, local)
        out, at = [], 0
        t0 = time.perf_counter()
        for r in rollouts:
            n = r["input_ids"].shape[0]
            r["advantages"] = mine[at:at + n].float()
            at += n
            if self.rl.beta > 0:
                r["ref_logps"] = self._reference_logps(t, r)
            r["num_tokens"], r["num_examples"] = r["attention_mask"].sum(), torch.tensor(n)
            out.append({k: v for k, v in r.items() if isinstance(v, torch.Tensor)})  # what the step moves to the device
        self._add(t, "reference_s", time.perf_counter() - t0)
        seqs = sum(float(r["completion_mask"].shape[0]) for r in out)  # every completion, masked ones too (TRL's)
        tokens = sum(float(r["completion_mask"].sum()) for r in out)
        seqs, tokens = all_reduce_sum([seqs, tokens], t.ctx.device)
        self.totals = rl_loss.Totals(seqs, tokens)
        return out

    def _rolled(self, t: Trainer, window: list[dict], step: int, rollouts: list[dict] | None) -> list[dict]:
        """The window's rollouts: ``rollouts`` (sampled ahead), or sampled now by the current policy."""
        self.device = t.ctx.device
        if rollouts is None:
            policy = unwrap(t.model)
            was_training = policy.training
            policy.eval()  # no dropout while sampling
            self._sync(t)
            t0 = time.perf_counter()
            rollouts = [self._sample(t, batch, step) for batch in window]
            self._add(t, "rollout_s", time.perf_counter() - t0)
            policy.train(was_training)
        self._add(t, "steps", 1.0)
        return rollouts

    def _sample(self, t: Trainer, batch: dict, step: int, count: bool = True) -> dict:
        """This micro-batch's completions: all its groups in one batch (each prompt repeated, left-padded), each row
        drawn from its own random stream (its prompt's seed and its place in the group): the same completions on any
        number of workers, whatever else shares the micro-batch. ``count``: add them to the train record's stats
        (not an evaluation's)."""
        request = self._request(t, batch, step)
        out, sampled = self._engine(t).generate(request["ids"], request["mask"], request["seeds"], **request["how"])
        return self._finish(t, request, out, sampled, count)

    def _request(self, t: Trainer, batch: dict, step: int) -> dict:
        return request_for(batch, step, self.cfg, self.tokenizer.eos_token_id, t.spec.pad_token_id)

    def _finish(self, t: Trainer, request: dict, out: torch.Tensor, sampled: torch.Tensor, count: bool) -> dict:
        """The engine's tokens for ``request`` made its completion batch (each completion through its first EOS;
        with tools, continued through its calls: worker/tool_rollouts.py)."""
        rows = first_turns(request, out, sampled, self.rl.max_completion_length)
        r = {"extras": request["extras"]}
        if self.conversing is not None:
            together = (lambda v: all_reduce_sum(v, t.ctx.device)) if all_done_for(t) is not None else None
            r["environments"], calls = self.conversing.converse(self._engine(t), request["how"], rows,
                                                                request["extras"], together)
            r["messages"] = [c.messages for c in rows]
            if count:
                self._add(t, "tool_calls", float(calls.calls))
                self._add(t, "tool_failures", float(calls.failures))
        if count:
            self._add(t, "length", float(sum(len(c.tokens) for c in rows)))
            self._add(t, "truncated", float(sum(c.truncated for c in rows)))
            self._add(t, "completions", float(len(rows)))
        return {**r, **completion_batch(rows, request["how"]["pad"], self.rl.mask_truncated_completions)}

    # -- the engine and its weights (worker/rollout.py) -------------------------------------------------------

    def _engine(self, t: Trainer) -> Colocated | RolloutPool | VLLMEngine:
        if self.engine is None:
            self.engine = start_engine(t)
        return self.engine

    def _sync(self, t: Trainer, count: bool = True, defer: bool = False) -> None:
        """The engine brought to the last optimizer step's policy where it holds weights of its own. ``count``: the
        time is the step's (``time/sync_s``; an evaluation's is not). ``defer``: sent, and waited for with the
        rollouts sent after it (one training rank: worker/rollout.py ``sync_engine``)."""
        t0 = time.perf_counter()
        mb = sync_engine(t, self._engine(t), defer)
        if mb is not None:
            self.sync_mb = mb
            if count:
                self._add(t, "sync_s", time.perf_counter() - t0)

    def _rewards(self, t: Trainer, r: dict) -> torch.Tensor:
        """[completions, reward functions] (NaN where a function returned None)."""
        tok, extras = self.tokenizer, r["extras"]
        texts = [tok.decode(c, skip_special_tokens=True) for c in r["completion_ids"]]
        prompts = [e["prompt"] for e in extras]
        completions = [[{"role": "assistant", "content": x}] if isinstance(p, list) else x
                       for p, x in zip(prompts, texts)]
        if "messages" in r:  # a tool rollout's turns: its assistant turns and the tools' replies (TRL's)
            completions = r["messages"]
        keys = sorted({k for e in extras for k in e["columns"]})
        columns = {k: [e["columns"].get(k) for e in extras] for k in keys}
        out = []
        for spec, fn in zip(self.specs, self.funcs):
            extra = {}
            if spec == "accuracy":
                extra = {"answer": columns.get(self.rl.answer_column)}
            elif spec == "length":
                extra = {"max_completion_length": self.rl.max_completion_length}
            cols = {k: v for k, v in columns.items() if spec not in rl_rewards.BUILTINS or k not in extra}
            if r.get("environments") is not None:  # TRL gives every reward function the completions' environments
                extra["environments"] = r["environments"]
            out.append(rl_rewards.call(spec, fn, prompts, completions, r["completion_ids"], cols, **extra))
        r["texts"], r["prompts"] = texts, prompts
        return torch.tensor(out, dtype=torch.float64).T

    def _judge(self, t: Trainer, everyone: torch.Tensor, step: int) -> None:
        """rl/unscored.py on the whole step's rewards (the same on every rank): the first unscored group said, a
        run that learns from nothing ended (every rank raises at the same step)."""
        from scaletrain.errors import TrainingError
        from scaletrain.metrics.alerts import Alert, write_alert

        verdict = self.unscored.observe(everyone, step)
        for message, severity in ((verdict.notice, "warning"), (verdict.stop, "error")):
            if message and t.ctx.is_main:
                log.warning("%s", message)
                write_alert(t.spec.run_dir, Alert("unscored_rewards", message, step=step, severity=severity))
        if verdict.stop:
            raise TrainingError(verdict.stop)

    def _write_samples(self, t: Trainer, r: dict, rewards: torch.Tensor, step: int) -> None:
        """The first prompt of the step and three of its completions, with their rewards (rank 0)."""
        with open(t.run_dir.samples, "a", encoding="utf-8") as f:
            for i in range(min(3, len(r["texts"]))):
                prompt = r["prompts"][i]
                shown = prompt[-1]["content"] if isinstance(prompt, list) else prompt
                values = {n: (None if math.isnan(float(v)) else float(v)) for n, v in zip(self.names, rewards[i])}
                f.write(json.dumps({"step": step, "prompt": shown, "completion": r["texts"][i],
                                    "rewards": values}, ensure_ascii=False) + "\n")

    def _reward_stats(self, t: Trainer, local: torch.Tensor) -> None:
        total = (local * self.weights.unsqueeze(0)).nansum(dim=1)
        total[torch.isnan(local).all(dim=1)] = math.nan
        for name, values in (("reward", total), *((f"rewards/{n}", local[:, i]) for i, n in enumerate(self.names))):
            ok = values[~torch.isnan(values)]
            self._add(t, name, float(ok.sum()))
            self._add(t, f"{name}_sq", float((ok ** 2).sum()))
            self._add(t, f"{name}_n", float(ok.numel()))

    @torch.no_grad()
    def _policy_logps(self, t: Trainer, r: dict) -> torch.Tensor:
        """The policy's log-probabilities of ``r``'s completion tokens now (no gradient)."""
        with t.precision.autocast():
            logits = t.model(input_ids=r["input_ids"].to(t.ctx.device),
                             attention_mask=r["attention_mask"].to(t.ctx.device), use_cache=False).logits
        return completion_logps(logits, r["input_ids"].to(t.ctx.device), r["starts"], r["completion_mask"].shape[1],
                                temperature=self.rl.temperature)

    def _reference_logps(self, t: Trainer, r: dict) -> torch.Tensor:
        import contextlib

        model = unwrap(t.model)
        context = model.disable_adapter() if t.lora else contextlib.nullcontext()
        with torch.no_grad(), context, t.precision.autocast():
            net = model if t.lora or t.reference is None else t.reference
            logits = net(input_ids=r["input_ids"].to(t.ctx.device),
                         attention_mask=r["attention_mask"].to(t.ctx.device), use_cache=False).logits
        return completion_logps(logits, r["input_ids"].to(t.ctx.device), r["starts"], r["completion_mask"].shape[1],
                                temperature=self.rl.temperature)

    # -- the loss --------------------------------------------------------------------------------------------

    def micro_loss(self, t: Trainer, batch: dict, n_micro: int) -> torch.Tensor:
        ids = batch["input_ids"]
        logits = t.model(input_ids=ids, attention_mask=batch["attention_mask"], use_cache=False).logits
        mask = batch["completion_mask"]
        width = mask.shape[1]
        logps, entropy = completion_logps(logits, ids, batch["starts"], width, with_entropy=True,
                                          temperature=self.rl.temperature)
        sampling, old = batch.get("sampling_logps"), batch.get("old_logps")
        trainer = old if old is not None else logps.detach()  # TRL's old_per_token_logps
        weights = keep = None
        if self.corrects and sampling is not None:
            weights = rl_loss.sampling_correction(trainer, sampling, mask, self.rl)
        if self.rl.off_policy_mask_threshold is not None and sampling is not None:
            keep = rl_loss.off_policy_mask(batch["advantages"], logps, sampling, mask,
                                           self.rl.off_policy_mask_threshold)
        terms = rl_loss.per_token_loss(logps, old, batch.get("ref_logps"), batch["advantages"], mask, self.rl,
                                       is_weights=weights, keep=keep)
        loss = rl_loss.reduce(terms.per_token, mask, self.rl, self.totals) * t.ctx.world_size
        with torch.no_grad():
            if terms.kl is not None:
                self._add(t, "kl", float((terms.kl * mask).sum()))
            self._add(t, "entropy", float((entropy * mask).sum()))
            self._add(t, "tokens", float(mask.sum()))
            if "sampling_logps" in batch:  # the engine's log-probabilities of the same tokens against the policy
                # that sampled them (this one; with rl.num_iterations > 1 the generation's, kept with the batch)
                sampler = batch["old_logps"] if "old_logps" in batch else logps
                self._add(t, "logp_diff", float(((sampler - batch["sampling_logps"]).abs() * mask).sum()))
            if weights is not None:  # TRL's sampling/importance_sampling_ratio/*: over tokens, or completions
                seen = weights.flatten() if weights.shape[1] == 1 else weights[mask.bool()]
                self._add(t, "is_sum", float(seen.sum()))
                self._add(t, "is_n", float(seen.numel()))
                if seen.numel():
                    self.extremes[0] = min(self.extremes[0], float(seen.min()))
                    self.extremes[1] = max(self.extremes[1], float(seen.max()))
            low, high, count = rl_loss.clip_counts(terms, batch["advantages"], mask, self.rl)
            self._add(t, "clip_low", low)
            self._add(t, "clip_high", high)
            self._add(t, "clip_count", count)
        return loss

    def record(self, sums: list[float]) -> dict[str, float]:
        """TRL's metric names: reward, reward_std, rewards/NAME/mean and /std, kl, entropy, clip_ratio/*,
        completions/mean_length and clipped_ratio."""
        s = dict(zip(self.stats, sums))
        out = {}
        for name, key in (("reward", "reward"), *((f"rewards/{n}", f"rewards/{n}") for n in self.names)):
            n = s[f"{name}_n"]
            if s["completions"] and name != "reward":  # the completions it returned None for (not applicable)
                out[f"{key}/none_ratio"] = 1.0 - n / s["completions"]
            if n:
                mean = s[name] / n
                var = max(s[f"{name}_sq"] / n - mean ** 2, 0.0)
                std = math.sqrt(var * n / (n - 1)) if n > 1 else 0.0
                out[key if name == "reward" else f"{key}/mean"] = mean
                out["reward_std" if name == "reward" else f"{key}/std"] = std
        if s["completions"]:
            out["completions/mean_length"] = s["length"] / s["completions"]
            out["completions/clipped_ratio"] = s["truncated"] / s["completions"]
        if self.tools is not None and s["completions"]:  # TRL's names: calls per completion, failures per call
            out["tools/call_frequency"] = s["tool_calls"] / s["completions"]
            out["tools/failure_frequency"] = s["tool_failures"] / s["tool_calls"] if s["tool_calls"] else 0.0
        if s["tokens"]:
            out["entropy"] = s["entropy"] / s["tokens"]
            # TRL's name: the engine's and the trainer's log-probabilities of the sampled tokens, mean |difference|
            out["sampling/sampling_logp_difference/mean"] = s["logp_diff"] / s["tokens"]
            if self.rl.beta > 0:
                out["kl"] = s["kl"] / s["tokens"]
        if s["clip_count"]:
            out["clip_ratio/low_mean"] = s["clip_low"] / s["clip_count"]
            out["clip_ratio/high_mean"] = s["clip_high"] / s["clip_count"]
        if s["steps"]:  # each step's split, the mean over ranks (sync: the separate engine's)
            for part in ("rollout", "reference", "sync"):
                out[f"time/{part}_s"] = s[f"{part}_s"] / s["steps"]
            # completion tokens over the ranks' mean rollout time: the engine's throughput, all ranks together
            out["throughput/rollout_tokens_per_s"] = s["length"] / max(s["rollout_s"] / self.world, 1e-9)
        if self.engine is not None and not isinstance(self.engine, Colocated):
            out["rollout/version"] = self.engine.version
            out["rollout/sync_mb"] = self.sync_mb
        if self.corrects or self.staleness:  # min and max over the ranks (the sums above are sums)
            low, high, behind = self.extremes
            lows = all_gather_floats([-low if math.isfinite(low) else -math.inf, high, behind], self.device)
            self.extremes = [math.inf, -math.inf, 0.0]
            if s["is_n"]:
                out["sampling/importance_sampling_ratio/mean"] = s["is_sum"] / s["is_n"]
                out["sampling/importance_sampling_ratio/min"] = -max(r[0] for r in lows)
                out["sampling/importance_sampling_ratio/max"] = max(r[1] for r in lows)
            if s["lag_n"]:
                out["rollout/staleness_mean"] = s["lag_sum"] / s["lag_n"]
                out["rollout/staleness_max"] = max(r[2] for r in lows)
                out["rollout/stale_dropped"] = s["stale_dropped"]
        return out


def environment_reward(environments, **_) -> list[float | None]:
    """``rl.environment``'s own reward (TRL's): each completion's environment's ``get_reward()``."""
    return [e.get_reward() for e in environments]
