"""The rollout engine of ``train.stage: grpo`` behind one interface, and a training worker's handling of it
(``start_engine``, ``sync_engine``): ``Colocated`` samples with the policy the worker trains; ``RolloutPool`` sends
the prompts to a pool of Ray actors on their own devices (``rollout.placement: separate``, as verl, OpenRLHF and
NeMo-RL place theirs), which hold a copy of the policy kept current by a weight sync.

The sync (``RolloutPool.sync``): before a step's rollout the engine gets the policy of the last optimizer step, the
whole model once (the first sync of a worker group: the start, or a resume's checkpoint) and then the trainable
tensors only (LoRA's adapter when training LoRA: applied by copying its values into the adapter the actor built,
so never applied twice), each sync with a version (the optimizer steps it holds) that the trainer records
(``rollout/version``) and each actor writes to ``rollout.jsonl`` in the run directory and echoes back. The payload
travels through Ray's object store (one ``ray.put``, read by every actor; CPU tensors). Every wait on an actor has
``rollout.sync_timeout_s``: a sync (or start) that takes longer, or an actor that died, ends in one line naming the
actor, the version and the phase, never a hang. The rollouts draw from the same per-row random streams as the
colocated engine (rl/sampling.py), so a separate engine samples the same completions from the same weights.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time

import torch

from scaletrain.errors import TrainingError
from scaletrain.rl.sampling import sample
from scaletrain.rundir import RunDir

log = logging.getLogger(__name__)

# Wrapped by the engine: torch.compile's regional wrapper and activation checkpointing's put these into names.
_WRAPPER_PARTS = ("_orig_mod.", "_checkpoint_wrapped_module.")


def clean_name(name: str) -> str:
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def sync_payload(model, full: bool) -> dict:
    """What a sync sends (rank 0's; a collective under FSDP, the shards gathered): every tensor of the model's state,
    or its trainable parameters only. torch's ``ignore_frozen_params`` keeps a tied head (a frozen embedding under
    another name, as big as the vocabulary), so the trainable names are taken from the parameters themselves."""
    from scaletrain.worker.parallel import full_model_state, unwrap

    state = full_model_state(model, trainable_only=not full)
    if not full:
        trainable = {clean_name(n) for n, p in unwrap(model).named_parameters() if p.requires_grad}
        state = {k: v for k, v in state.items() if clean_name(k) in trainable}
    return {clean_name(k): v.detach().cpu() for k, v in state.items()}


def generators_for(seeds: list[int], device) -> list[torch.Generator]:
    """One random stream per row (rl/sampling.py), on the device that samples (CPU tensors draw on the CPU)."""
    where = device if str(device).startswith("cuda") else "cpu"
    return [torch.Generator(device=where).manual_seed(s) for s in seeds]


class Colocated:
    """``rollout.placement: colocated``: the training worker samples its own prompts with the policy it trains."""

    placement = "colocated"
    version = None

    def __init__(self, policy, device, autocast, all_done=None):
        self.policy, self.device, self.autocast, self.all_done = policy, device, autocast, all_done

    def generate(self, ids: torch.Tensor, mask: torch.Tensor, seeds: list[int], **how
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The sampled tokens and their log-probabilities (rl/sampling.py)."""
        with self.autocast():
            return sample(self.policy, ids.to(self.device), mask.to(self.device),
                          generators_for(seeds, self.device), all_done=self.all_done, **how)


class RolloutWorker:
    """One rollout actor: the run's model built from its config (the same builder as the trainer, so the same
    parameter names and dtypes), its weights only ever from a sync."""

    def __init__(self, index: int, config: dict, vocab, device: str, threads: int, run_dir: str | None):
        from scaletrain.config.schema import Config
        from scaletrain.model.build import build_model, trained_model_config
        from scaletrain.worker.precision import Precision

        torch.set_num_threads(threads)  # the trainer's: the same CPU kernels, the same sums, the same samples
        cfg = Config.model_validate(config)
        self.index, self.device, self.version = index, device, None
        self.precision = Precision(cfg, device)
        self.log = RunDir(run_dir).rollout if run_dir and "://" not in run_dir else None
        self.vllm = None
        if cfg.rollout.engine == "vllm":  # vLLM on this actor's GPU, given the trainer's adapter files or state
            from scaletrain.model.files import model_dir
            from scaletrain.worker.vllm_engine import VLLMEngine, check_vllm, vllm_dtype

            check_vllm(device)
            self.vllm = VLLMEngine(str(model_dir(cfg.model.name_or_path)),
                                   cfg.model.lora_rank if cfg.model.finetuning_type == "lora" else None, cfg.rollout,
                                   cfg.train.seed, cfg.data.max_length + cfg.rl.max_completion_length,
                                   vllm_dtype(self.precision.policy.compute), executor="uni")
            self.tensors = {}
            return
        self.model = build_model(trained_model_config(cfg.model, cfg.train.stage), vocab, cfg.data.label_names,
                                 frozen_dtype=self.precision.policy.torch_dtype("frozen"), device=device)
        self.model.to(device).eval().requires_grad_(False)
        self.tensors = {clean_name(k): v for k, v in self.model.state_dict().items()}

    def ready(self) -> int:
        return self.index

    @torch.no_grad()
    def load(self, version: int, payload: dict, full: bool) -> dict:
        """The trainer's tensors copied into this actor's model; the version echoed (the trainer checks it)."""
        if self.vllm is not None:
            done = {"actor": self.index, **self.vllm.load_payload(version, payload), "time": time.time()}
            self.version = version
            return self._logged(done)
        t0 = time.perf_counter()
        unknown = sorted(set(payload) - set(self.tensors))
        missing = sorted(set(self.tensors) - set(payload)) if full else []
        if unknown or missing:
            raise TrainingError(f"rollout actor {self.index}: the weight sync of version {version} does not match "
                                f"its model (unknown {unknown[:3]}, missing {missing[:3]}); a bug: report it")
        for name, value in payload.items():
            self.tensors[name].copy_(value.to(self.tensors[name].device))
        self.version = version
        done = {"actor": self.index, "version": version, "kind": "full" if full else "trainable",
                "tensors": len(payload), "mb": payload_mb(payload), "load_s": time.perf_counter() - t0,
                "time": time.time()}
        return self._logged(done)

    def _logged(self, done: dict) -> dict:
        log.info("rollout actor %d: weights version %d (%s, %.3f MB)", self.index, done["version"], done["kind"],
                 done["mb"])
        if self.log is not None:
            with open(self.log, "a", encoding="utf-8") as f:
                f.write(json.dumps(done) + "\n")
        return done

    def generate(self, version: int, ids: torch.Tensor, mask: torch.Tensor, seeds: list[int], how: dict):
        if self.version != version:
            raise TrainingError(f"rollout actor {self.index} holds weights version {self.version} and was asked to "
                                f"sample with version {version}; a bug: report it")
        if self.vllm is not None:
            return self.vllm.generate(ids, mask, seeds, **how)
        with self.precision.autocast():
            tokens, logps = sample(self.model, ids.to(self.device), mask.to(self.device),
                                   generators_for(seeds, self.device), **how)
        return tokens.cpu(), logps.cpu()

    def digest(self) -> dict[str, str]:
        """Each tensor's bytes hashed: the tests' bit-for-bit check against the trainer."""
        return {k: tensor_digest(v) for k, v in self.tensors.items()}

    def hold(self, seconds: float) -> None:
        """Busy for ``seconds``: a stuck engine, for the drills and tests of the sync's timeout."""
        time.sleep(seconds)


def payload_mb(payload: dict) -> float:
    return sum(v.numel() * v.element_size() for v in payload.values()) / 2**20


def tensor_digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


class RolloutPool:
    """The separate engine as a training rank sees it: the actors (created by rank 0, found by name by the others),
    the version they hold, and every wait on them bounded by ``timeout_s``."""

    placement = "separate"

    def __init__(self, names: list[str], handles: list, timeout_s: float, mine: int):
        self.names, self.handles, self.timeout_s, self.mine = names, handles, timeout_s, mine
        self.version: int | None = None
        self.deferred: tuple | None = None  # a sync sent and not yet waited for (``sync(wait=False)``)

    @classmethod
    def start(cls, names: list[str], config: dict, vocab, device: str, timeout_s: float, mine: int,
              run_dir: str | None) -> RolloutPool:
        """Rank 0: the actors started (one device each: a GPU, or a CPU core) and ready within ``timeout_s``."""
        import ray

        on_gpu = str(device).startswith("cuda")
        actor = ray.remote(RolloutWorker)
        # outside the trainer's placement group (scheduling_strategy), whose bundles are the training workers' own
        handles = [actor.options(name=name, num_cpus=1, num_gpus=1 if on_gpu else 0, scheduling_strategy="DEFAULT",
                                 max_restarts=0).remote(i, config, vocab, "cuda" if on_gpu else "cpu",
                                                        torch.get_num_threads(), run_dir)
                   for i, name in enumerate(names)]
        pool = cls(names, handles, timeout_s, mine)
        pool._wait([h.ready.remote() for h in handles], None, "start",
                   "the cluster may have no free " + ("GPU" if on_gpu else "CPU") + " for it")
        return pool

    @classmethod
    def join(cls, names: list[str], timeout_s: float, mine: int) -> RolloutPool:
        import ray

        return cls(names, [ray.get_actor(n) for n in names], timeout_s, mine)

    def sync(self, version: int, payload: dict, full: bool, wait: bool = True) -> dict:
        """``payload`` to every actor (rank 0 calls it); the first reply's record. ``wait=False`` (one training
        rank, asynchronous GRPO): sent, not waited for: the rollouts this rank sends next run after it on the actor
        (Ray runs one caller's tasks in order), so the trainer trains while the actor loads; the replies are checked,
        with the same timeout and names, before anything else is waited for (``settle``)."""
        import ray

        self.settle()
        ref = ray.put(payload)
        refs = [h.load.remote(version, ref, full) for h in self.handles]
        phase = "sync (full weights)" if full else "sync (trainable tensors)"
        self.version = version
        if not wait:
            self.deferred = (refs, version, phase)
            return {"version": version, "mb": payload_mb(payload)}
        return self._checked(self._wait(refs, version, phase), version)

    def settle(self) -> None:
        """A sync sent without waiting, waited for and checked."""
        if self.deferred is not None:
            refs, version, phase = self.deferred
            self.deferred = None
            self._checked(self._wait(refs, version, phase), version)

    def _checked(self, replies: list[dict], version: int) -> dict:
        for i, r in enumerate(replies):
            if r["version"] != version:
                raise TrainingError(f"rollout actor {i} ({self.names[i]}) says it holds version {r['version']} "
                                    f"after the sync of version {version}; a bug: report it")
        return replies[0]

    def generate(self, ids: torch.Tensor, mask: torch.Tensor, seeds: list[int], **how
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows sampled by its actor (rank i uses actor i mod the pool's size). No timeout of its own:
        sampling takes as long as it takes; the step's heartbeat names the rank and its "rollout" phase if it hangs,
        and an actor that died ends the wait at once, named."""
        return self.collect(self.submit(ids, mask, seeds, **how))

    def submit(self, ids: torch.Tensor, mask: torch.Tensor, seeds: list[int], **how) -> tuple:
        """``generate`` started, not waited for (asynchronous GRPO: the actor samples while the trainer trains):
        (its reference, the version it samples with)."""
        h = self.handles[self.mine]
        return h.generate.remote(self.version, ids.cpu(), mask.cpu(), seeds, how), self.version

    def collect(self, submitted: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """What ``submit`` started, waited for as ``generate`` waits (a sync sent before it, first)."""
        self.settle()
        ref, version = submitted
        return self._wait([ref], version, "rollout", timeout=False, first=self.mine)[0]

    def _wait(self, refs: list, version: int | None, phase: str, hint: str = "", timeout: bool = True,
              first: int = 0) -> list:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        at = f" of version {version}" if version is not None else ""
        deadline = time.monotonic() + self.timeout_s if timeout else None
        out, pending = {}, list(refs)
        while pending:  # each reply read as it comes: an actor that died ends the wait at once
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                i = first + refs.index(pending[0])
                raise TrainingError(
                    f"rollout actor {i} ({self.names[i]}) did not finish the {phase}{at} within "
                    f"rollout.sync_timeout_s={self.timeout_s:g} s" + (f" ({hint})" if hint else "")
                    + "; check the actor's log (ray logs) or raise rollout.sync_timeout_s")
            j = refs.index(ready[0])
            i = first + j
            try:
                out[j] = ray.get(ready[0])
            except RayTaskError as e:
                cause = e.cause if isinstance(e.cause, Exception) else e
                raise TrainingError(f"rollout actor {i} ({self.names[i]}) failed in the {phase}{at}: "
                                    f"{str(cause).splitlines()[0] if str(cause) else type(cause).__name__}") from None
            except RayActorError as e:
                raise TrainingError(f"rollout actor {i} ({self.names[i]}) died during the {phase}{at}: "
                                    f"{(str(e).splitlines() or [type(e).__name__])[0]}") from None
        return [out[j] for j in range(len(refs))]

    def digests(self) -> list[dict[str, str]]:
        import ray

        self.settle()
        return ray.get([h.digest.remote() for h in self.handles], timeout=self.timeout_s)



# -- a training worker's engine: made at its first rollout, kept at the last optimizer step's policy ------------


def start_engine(t):
    """This worker's engine for ``rollout.engine`` / ``rollout.placement`` (``t``: the Trainer)."""
    if t.cfg.rollout.engine == "vllm":
        return _start_vllm(t)
    if t.cfg.rollout.placement == "colocated":
        from scaletrain.worker.parallel import unwrap

        return Colocated(unwrap(t.model), t.ctx.device, t.precision.autocast, all_done_for(t))
    return _start_pool(t)


def sync_engine(t, engine, defer: bool = False) -> float | None:
    """An engine with weights of its own brought to the policy of the last optimizer step (its version: the steps
    it holds): the whole model at its first sync, the trainable tensors after (LoRA's adapter only; vLLM takes it as
    peft's files). Returns the payload's MB, or None where nothing was synced (colocated hf, already current)."""
    from scaletrain.worker.parallel import unwrap

    version = t.progress.step
    if isinstance(engine, Colocated) or engine.version == version:
        return None
    full = engine.version is None or not t.lora
    if not isinstance(engine, RolloutPool):  # vLLM in this worker: each rank gives its own engine its replica
        return engine.load(version, full=full)["mb"]
    if t.cfg.rollout.engine == "vllm" and t.lora:
        from scaletrain.worker.vllm_engine import payload_of

        payload = payload_of(unwrap(t.model), lora=True) if t.ctx.is_main else {}
    else:  # a collective under FSDP (the shards gathered to rank 0); under DDP rank 0's replica is the policy
        payload = sync_payload(t.model, full) if t.ctx.is_main or t.cfg.train.strategy == "fsdp" else {}
    # deferred only where one rank sends both the sync and the rollouts after it (their order on the actor is Ray's)
    wait = not (defer and t.ctx.world_size == 1)
    reply = on_rank0(t.ctx, f"weight sync of version {version}", lambda: engine.sync(version, payload, full, wait))
    engine.version = version
    return reply["mb"] if reply is not None else 0.0


def _start_vllm(t):
    from scaletrain.model.files import model_dir
    from scaletrain.worker.parallel import unwrap
    from scaletrain.worker.vllm_engine import VLLMEngine, check_vllm, lora_rank_of, vllm_dtype

    check_vllm(t.ctx.device)
    policy, cfg = unwrap(t.model), t.cfg
    return VLLMEngine(str(model_dir(cfg.model.name_or_path)), lora_rank_of(policy) if t.lora else None, cfg.rollout,
                      cfg.train.seed, cfg.data.max_length + cfg.rl.max_completion_length,
                      vllm_dtype(t.precision.policy.compute), policy=policy)


def _start_pool(t) -> RolloutPool:
    """Rank 0 starts the actors (names of this worker group's own: a restarted group never finds the last one's),
    the others find them once they are ready; a start that fails stops every rank, rank 0 naming why."""
    import random

    import ray

    from scaletrain.errors import ConfigError
    from scaletrain.worker.parallel import all_reduce_sum

    r, ctx = t.cfg.rollout, t.ctx
    if not ray.is_initialized():
        raise ConfigError("rollout.placement=separate runs its engine in Ray actors and this worker is not in a Ray "
                          "job; set scaling.launcher: ray (or auto)")
    nonce = random.SystemRandom().randrange(2**52) if ctx.is_main else 0
    nonce = int(all_reduce_sum([float(nonce)], ctx.device)[0])  # rank 0's, to every rank
    names = [f"scaletrain-rollout-{nonce:x}-{i}" for i in range(r.num_workers)]
    mine = ctx.dp_rank % r.num_workers
    pool = on_rank0(ctx, "start of the rollout actors", lambda: RolloutPool.start(
        names, t.spec.config, t.spec.vocab, ctx.device, r.sync_timeout_s, mine,
        None if t.spec.store else str(t.spec.run_dir)))
    return pool if ctx.is_main else RolloutPool.join(names, r.sync_timeout_s, mine)


def on_rank0(ctx, what: str, fn):
    """``fn()`` on rank 0 with every rank told whether it worked: no rank waits on a collective for a rank 0 that
    failed (rank 0 raises its own error, naming the actor; the others a line that points to it)."""
    from scaletrain.worker.parallel import all_reduce_sum

    value, error = None, None
    if ctx.is_main:
        try:
            value = fn()
        except TrainingError as e:
            error = e
    failed = all_reduce_sum([1.0 if error is not None else 0.0], ctx.device)[0]
    if error is not None:
        raise error
    if failed:
        raise TrainingError(f"rank {ctx.world_rank}: the {what} failed on rank 0 (its error names the actor); this "
                            f"rank stops with it")
    return value


def all_done_for(t):
    """Under FSDP with several ranks: a collective that says whether every rank's rows are done (the sharded policy's
    forwards are collectives: a rank that stopped sampling first would pair its next all-gathers with another
    rank's generation); None where each rank samples with a whole model (DDP, one rank)."""
    if t.cfg.train.strategy != "fsdp" or t.ctx.world_size == 1:
        return None
    import torch.distributed as dist

    def all_done(mine: bool) -> bool:
        flag = torch.tensor([1.0 if mine else 0.0], device=t.ctx.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    return all_done
