"""The slowest-rank wait of a configured job, from its own data (scaling/straggler.py on the lengths `train`'s data
step gives): shared by `plan` (per world size, with the samplers that remove it) and `predict --straggler-from`
(the spread its data gives beside the spread a run measured)."""

from __future__ import annotations

SAMPLER_SETTING = {"random": "data.balance_ranks=false", "balanced": "data.balance_ranks=true",
                   "packed": "data.packing=true"}
SAMPLER_WHAT = {"random": "shuffled micro-batches padded to their longest row",
                "balanced": "the length-balanced sampler", "packed": "packed rows"}


def straggler_lines(cfg, timing: list[dict], read: str) -> list[str]:
    """The slowest-rank wait at the largest planned count, what it was sized from, and the samplers that remove it
    (their efficiency in points)."""
    r = next((t for t in reversed(timing) if t.get("workers", 1) > 1 and "straggler_s" in t), None)
    if r is None:
        return []
    by = r.get("straggler_by_sampler") or {}
    if not by:
        return [f"waiting for the slowest rank: not sized ({read}); the prediction assumes none"]
    mine, n, step = sampler_of(cfg), r["workers"], r["step_time_s"]
    line = (f"waiting for the slowest rank: {r['straggler_s'] / step:.1%} of the step at {n} devices, sized from the "
            f"data ({read}, {SAMPLER_WHAT[mine]})")
    better = [(k, w) for k, w in by.items() if k != mine and w < r["straggler_s"] - 0.005 * step]
    if better and r["straggler_s"] >= 0.02 * step:
        line += "; " + ", ".join(f"{SAMPLER_SETTING[k]} cuts it to {w / (step - r['straggler_s'] + w):.1%} (+"
                                 f"{100 * r['efficiency'] * (step / (step - r['straggler_s'] + w) - 1):.1f} points of "
                                 f"efficiency)" for k, w in sorted(better, key=lambda kw: kw[1]))
    return [line]


def sampler_of(cfg) -> str:
    """How the job draws its micro-batches (scaling/straggler.py's names)."""
    d = cfg.data
    return "packed" if d.packing else "balanced" if d.balance_ranks and cfg.model.task == "causal-lm" else "random"


def job_lengths(cfg) -> tuple[list[int] | None, str]:
    """The job's examples' token counts, from `train`'s own data step (cached: train reuses it), or why not."""
    from scaletrain.data.lengths import example_lengths
    from scaletrain.data.prepare import prepare_data
    from scaletrain.errors import ScaletrainError
    from scaletrain.model.processor import image_text_factory
    from scaletrain.model.tokenizer import load_tokenizer

    if cfg.data.streaming:
        return None, "a streamed data set is not read to plan (its lengths are known as it trains)"
    unpacked = cfg.model_copy(update={"data": cfg.data.model_copy(update={"packing": False})})  # the rows' own
    try:  # the tokenizer and the data step alone (the model's weights need not be here to plan)
        tokenizer = load_tokenizer(cfg.model.name_or_path)
        data = prepare_data(unpacked, tokenizer, image_text_factory(cfg.model.name_or_path, tokenizer))
    except (ScaletrainError, OSError) as e:
        return None, f"the data cannot be read: {str(e).splitlines()[0]}"
    return [int(n) for n in example_lengths(data.train)], f"{len(data.train)} examples"


def data_waits(cfg, shape, device, dtype, sizes, lengths: list[int]) -> dict[str, dict]:
    """The slowest-rank wait per step from the data's lengths under the job's sampler and the samplers that could
    replace it (scaling/straggler.py), per world size: {sampler: {n: Wait}}."""
    from scaletrain.config.batch import sequences_per_micro_batch
    from scaletrain.metrics.flops import ASSUMED_MFU, PEAK_TFLOPS, flops_per_token
    from scaletrain.scaling.straggler import Work, waits

    peak = PEAK_TFLOPS.get(device.key, {}).get(dtype)
    if not peak:
        return {}
    non_embedding = shape.layers * shape.block_compute_params
    lora = shape.trainable if cfg.model.finetuning_type == "lora" else None
    linear = flops_per_token(non_embedding, shape.layers, shape.hidden, 0, lora)
    if cfg.train.gradient_checkpointing:
        linear += 2 * non_embedding
    work = Work(linear, 12 * shape.layers * shape.hidden, peak * 1e12 * ASSUMED_MFU)
    t, mine = cfg.train, sampler_of(cfg)
    sync = "micro" if t.strategy == "fsdp" else "step"
    batch, accumulation = sequences_per_micro_batch(t), t.gradient_accumulation_steps
    out = {}
    for sampler in dict.fromkeys((mine, "balanced", "packed")):
        if sampler == "balanced" and cfg.model.task != "causal-lm":
            continue
        out[sampler] = waits(lengths, work, sizes, batch, accumulation, sampler, sync,
                             width=cfg.data.max_length, seed=t.seed)
    return out


def derived_rank_spread(run_dir: str, workers: int) -> tuple[float | None, str]:
    """The ranks' step spread (std / mean) a run's own data gives at ``workers`` ranks under its sampler, counting
    only its micro-batches' FLOPs (the largest the run can measure: any part of a step that does not grow with
    its rows lowers the measured one); or None and why not."""
    from scaletrain.config import load_config
    from scaletrain.errors import ScaletrainError
    from scaletrain.memory.plan import shape_for
    from scaletrain.metrics.flops import flops_per_token
    from scaletrain.model.tokenizer import plan_vocab
    from scaletrain.rundir import RunDir
    from scaletrain.scaling.straggler import Work, waits

    try:
        cfg = load_config(str(RunDir(run_dir).resolved_config), [])
        shape = shape_for(cfg, plan_vocab(cfg.model.name_or_path))
    except (ScaletrainError, OSError) as e:
        return None, f"its config cannot be read: {str(e).splitlines()[0]}"
    lengths, read = job_lengths(cfg)
    if not lengths:
        return None, read
    from scaletrain.config.batch import sequences_per_micro_batch

    non_embedding = shape.layers * shape.block_compute_params
    lora = shape.trainable if cfg.model.finetuning_type == "lora" else None
    work = Work(flops_per_token(non_embedding, shape.layers, shape.hidden, 0, lora), 12 * shape.layers * shape.hidden,
                1.0)  # a spread is a ratio: the rate cancels
    t, sampler = cfg.train, sampler_of(cfg)
    found = waits(lengths, work, [workers], sequences_per_micro_batch(t), t.gradient_accumulation_steps, sampler,
                  "micro" if t.strategy == "fsdp" else "step", width=cfg.data.max_length, seed=t.seed)
    return found[workers].rank_spread, f"{read}, {SAMPLER_WHAT[sampler]}"
