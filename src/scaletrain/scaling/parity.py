"""`scaletrain parity`: 1 worker at global batch B against N workers at B/N each, same seed and data order.

The distributed sampler hands rank r every N-th sample of the seeded epoch order, so the N workers'
step k sees exactly the 1-worker batch k. Classification averages per-sample losses (every rank's micro-batch
has as many samples); a causal LM's step loss is the token mean over every rank and micro-batch of the step
(worker/step.py), so both optimise the 1-worker objective. With dropout off the loss curves then agree to
float rounding (CPU fp32: below 1e-5 for causal-LM SFT with variable lengths, tests/integration/
test_parity_sft.py); a difference beyond the tolerance means the setup is not equivalent (most often: the LR
was scaled, or the global batch changed).
"""

from __future__ import annotations

from scaletrain.config.schema import Config
from scaletrain.errors import ConfigError
from scaletrain.metrics.records import read_jsonl
from scaletrain.rundir import RunDir

DEFAULT_TOLERANCE = 1e-3  # max relative difference of losses


def check_pair(cfg: Config, workers: int, steps: int, tolerance: float) -> None:
    """Every bad flag fails here, before Ray starts or a run directory exists."""
    b = cfg.train.per_device_train_batch_size
    if workers < 2:
        raise ConfigError("parity compares 1 worker with N >= 2 workers; pass --workers 2 or more")
    if steps < 1:
        raise ConfigError(f"--steps {steps}: parity compares the loss of each step; pass --steps 1 or more")
    if not tolerance >= 0:  # also catches NaN
        raise ConfigError(f"--tolerance {tolerance:g}: a relative difference is >= 0; pass e.g. --tolerance 1e-3")
    if b % workers:
        raise ConfigError(f"train.per_device_train_batch_size={b} is the 1-worker global batch and must divide by "
                          f"--workers {workers}; pick a batch that does")


def plan_pair(cfg: Config, workers: int, steps: int, keep_dropout: bool, out_dir) -> tuple[Config, Config]:
    """The 1-worker and the N-worker config (after ``check_pair``): global batch B on one, B/N each on N."""
    b = cfg.train.per_device_train_batch_size

    def make(n: int) -> Config:
        train = cfg.train.model_copy(update={"per_device_train_batch_size": b // n, "max_steps": steps,
                                             "logging_steps": 1, "eval_steps": 0})
        model = cfg.model if keep_dropout else cfg.model.model_copy(update={"dropout": 0.0})
        return cfg.model_copy(update={
            "model": model, "train": train, "scaling": cfg.scaling.model_copy(update={"num_workers": n}),
            "checkpoint": cfg.checkpoint.model_copy(update={"save_steps": 0}),
            "monitor": cfg.monitor.model_copy(update={"report": False}),
            "output": cfg.output.model_copy(update={"output_dir": str(out_dir), "run_name": f"workers-{n}"})})

    return make(1), make(workers)


# A loss that is 0 in expectation (GRPO's with one optimisation step per generation: the advantages of a group sum to
# 0) is compared on this floor, not relative to its float noise.
LOSS_FLOOR = 1e-4
# Besides the loss, GRPO's records: the same completions give the same rewards, the same weights the same KL.
ALSO = ("reward", "kl")


def compare(run1, run_n) -> dict:
    def series(run, key="train/loss"):
        return {r["step"]: r[key] for r in read_jsonl(RunDir(run).metrics) if r["kind"] == "train" and key in r}

    def losses(run):
        return series(run)

    def final_eval(run):
        evals = [r for r in read_jsonl(RunDir(run).metrics) if r["kind"] == "eval"]
        return evals[-1].get("eval/loss") if evals else None  # an empty eval split has no loss

    a, b = losses(run1), losses(run_n)
    steps = sorted(set(a) & set(b))
    rel = [abs(a[s] - b[s]) / max(abs(a[s]), LOSS_FLOOR) for s in steps]
    for key in ALSO:  # (GRPO) worse of the loss's and these series' differences, step by step
        x, y = series(run1, key), series(run_n, key)
        rel = [max(r, abs(x[s] - y[s]) / max(abs(x[s]), LOSS_FLOOR)) if s in x and s in y else r
               for r, s in zip(rel, steps)]
    ea, eb = final_eval(run1), final_eval(run_n)
    return {"steps": len(steps), "max_rel_loss_diff": max(rel) if rel else float("inf"),
            "worst_step": steps[rel.index(max(rel))] if rel else None,
            "final_eval_loss_1": ea, "final_eval_loss_n": eb,
            "final_eval_rel_diff": abs(ea - eb) / max(abs(ea), 1e-12) if ea is not None and eb is not None else None}


def verdict(result: dict, tolerance: float) -> bool:
    worst = max(result["max_rel_loss_diff"], result["final_eval_rel_diff"] or 0.0)
    return worst <= tolerance
