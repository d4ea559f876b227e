"""The memory plan: the estimate's parts, the levers' effect, `scaletrain plan` on an 8B config read from its
config alone, and the bad inputs of the fitting-big-models issue."""

import os
import sys

import pytest
import torch

from scaletrain.config import validate
from scaletrain.errors import ConfigError
from scaletrain.memory.estimate import GIB, estimate, model_shape
from scaletrain.memory.plan import device_named, variants, verdict
from scaletrain.model.tokenizer import Vocab, load_tokenizer
from tests.cli import run_cli


def _cfg(**train):
    finetuning = train.pop("finetuning_type", "full")
    return validate({"model": {"name_or_path": "builtin:llama-100m", "task": "causal-lm",
                               "finetuning_type": finetuning},
                     "data": {"train_file": "x.jsonl", "max_length": 512},
                     "train": {"per_device_train_batch_size": 4, "per_device_eval_batch_size": 4, **train},
                     "scaling": {"num_workers": 2}})


@pytest.fixture(scope="module")
def vocab():
    return len(load_tokenizer("builtin:llama-100m"))


def _shape(cfg, vocab):
    return model_shape(cfg, Vocab(vocab, 0), 4, 512, 4)


def test_the_estimate_counts_what_each_strategy_keeps(vocab):
    cfg = _cfg()
    s = _shape(cfg, vocab)
    assert s.layers == 12 and s.hidden == 768 and 75e6 < s.total < 85e6 and s.trainable == s.total
    ddp = estimate(cfg, s, 2, "gpu")
    assert ddp.parameters == 4 * s.total and ddp.optimizer == 8 * s.total and ddp.buffers == 4 * s.total
    fsdp = estimate(_cfg(strategy="fsdp"), s, 2, "gpu")
    state = lambda b: b.parameters + b.optimizer + (4 * s.trainable // 2)
    assert state(fsdp) <= 0.55 * (ddp.parameters + ddp.optimizer + 4 * s.trainable)  # the benchmark's target
    zero2 = estimate(_cfg(strategy="fsdp", fsdp_reshard_after_forward=False), s, 2, "gpu")
    assert zero2.buffers > fsdp.buffers  # every block stays gathered through backward
    hybrid = estimate(_cfg(strategy="fsdp", fsdp_shard_size=1), s, 2, "gpu")
    assert hybrid.parameters == ddp.parameters  # sharded over groups of 1: replicated
    offload = estimate(_cfg(strategy="fsdp", fsdp_offload=True), s, 2, "gpu")
    assert offload.parameters == offload.optimizer == 0 and offload.host == fsdp.parameters + fsdp.optimizer + \
        4 * s.trainable // 2
    ckpt = estimate(_cfg(gradient_checkpointing=True), s, 2, "gpu")
    plain_act = s.act_blocks + s.act_outside
    assert s.act_block_inputs < 0.2 * s.act_blocks  # a block keeps its input only
    assert ckpt.peak < ddp.peak and ddp.overhead == GIB and estimate(cfg, s, 2, "cpu").overhead == 0
    lora = _cfg(finetuning_type="lora")
    ls = _shape(lora, vocab)
    assert ls.trainable < 0.05 * ls.total and estimate(lora, ls, 1, "gpu").optimizer == 8 * ls.trainable
    assert plain_act > 0


def test_the_meta_pass_counts_fused_attention_not_the_seq_by_seq_weights(vocab):
    cfg = _cfg()
    short, long = model_shape(cfg, Vocab(vocab, 0), 1, 256, 1), model_shape(cfg, Vocab(vocab, 0), 1, 1024, 1)
    assert long.act_blocks == pytest.approx(4 * short.act_blocks, rel=0.01)  # linear in the sequence


def test_plan_answers_for_an_8b_model_in_seconds_from_its_config(tmp_path):
    from transformers import LlamaConfig

    d = tmp_path / "llama8b"
    LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                tie_word_embeddings=False).save_pretrained(d)  # config only: no weights, no tokenizer
    assert sorted(p.name for p in d.iterdir()) == ["config.json"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{name_or_path: {d}, task: causal-lm, finetuning_type: lora, lora_rank: 16}}\n"
                   f"data: {{train_file: x.jsonl, max_length: 4096}}\n"
                   f"train: {{strategy: fsdp, bf16: true, per_device_train_batch_size: 1, "
                   f"per_device_eval_batch_size: 1, gradient_checkpointing: true}}\nscaling: {{num_workers: 8}}\n")
    proc = run_cli("plan", cfg, "--device", "mi300x", "--json", "--mtbf-hours", "24")
    assert proc.returncode == 0, proc.stderr
    import json

    out = json.loads(proc.stdout)
    assert out["device"] == "MI300X" and out["device_memory_gib"] == 192
    configured = {r["devices"]: r for r in out["rows"] if r["variant"] == "configured"}
    # a LoRA base stored in bf16, as LLaMA-Factory and TRL load it (and the run holds it): ~15 GiB, not 30
    assert 7.9e9 * 2 / GIB < configured[1]["parameters"] < 8.2e9 * 2 / GIB
    assert configured[8]["parameters"] == pytest.approx(configured[1]["parameters"] / 8, rel=1e-3)
    assert all(r["fits"] for r in configured.values())
    assert out["verdicts"]["8"].startswith("fits in 192 GiB with ")
    assert [r["workers"] for r in out["timing"]] == [1, 2, 4, 8] and out["timing"][0]["speedup"] == 1.0
    ck = out["checkpoint_interval"]  # Young/Daly: sqrt(2 x checkpoint s x MTBF s), in steps of the plan's step
    assert ck["interval_s"] == pytest.approx((2 * ck["checkpoint_s"] * 24 * 3600) ** 0.5)
    assert ck["save_steps"] == max(1, round(ck["interval_s"] / ck["step_s"])) and "Young/Daly" in ck["note"]
    full = run_cli("plan", cfg, "--device", "h100", "--gpus", "1", "model.finetuning_type=full",
                   "train.gradient_checkpointing=false", env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert full.returncode != 0
    lines = full.stdout.splitlines()
    # readable in an 80-column terminal or log (but for the model's path, as long as the folder it is in)
    assert lines and max(len(ln) for ln in lines if str(d) not in ln) <= 80, full.stdout
    head = next(i for i, ln in enumerate(lines) if ln.split()[:1] == ["devices"])
    assert lines[head].split() == ["devices", "peak", "GiB", "largest", "part", "fits", "step", "s", "speedup",
                                   "effic."]
    row = lines[head + 1].split()
    assert row[0] == "1" and row[1] == f"{float(row[1]):.1f}"  # whole numbers, never cut
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the job fits none of --gpus 1 on H100-SXM") and "train.strategy=fsdp" in last


def test_verdicts_and_advice(vocab):
    cfg = _cfg()
    s = _shape(cfg, vocab)
    small = device_named("a100-40gb")
    ok, text = verdict(cfg, s, 1, small)
    assert ok and text.startswith("fits in 40 GiB with ")
    tiny = type(small)("test", int(1.5 * GIB))
    ok, text = verdict(cfg, s, 1, tiny)
    assert not ok and "does not fit: needs" in text
    assert "gradient_checkpointing" in text or "fsdp" in text
    assert [name for name, _ in variants(cfg)][:2] == ["configured", "+checkpointing"]


def test_bad_plan_and_fit_input():
    with pytest.raises(ConfigError, match=r"--device mi300: no memory size known for it; did you mean mi300x"):
        device_named("mi300")
    base = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"}, "data": {"train_file": "x"}}
    with pytest.raises(ConfigError, match=r"train.fsdp_shard_size=3 does not divide scaling.num_workers=4"):
        validate({**base, "train": {"strategy": "fsdp", "fsdp_shard_size": 3}, "scaling": {"num_workers": 4}})
    with pytest.raises(ConfigError, match=r"train.fsdp_offload applies to train.strategy=fsdp \(the config has ddp\)"):
        validate({**base, "train": {"fsdp_offload": True}})


def test_fsdp_policies_on_a_gpu_are_mixed_precision_and_offload():
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    from scaletrain.model.precision import policy
    from scaletrain.worker.parallel import fsdp_policies

    t = _cfg(strategy="fsdp", bf16=True, fsdp_offload=True).train
    gpu = fsdp_policies(t, "cuda:0", policy("gpu", bf16=True, fp16=False, strategy="fsdp"))
    assert isinstance(gpu["mp_policy"], MixedPrecisionPolicy) and isinstance(gpu["offload_policy"], CPUOffloadPolicy)
    assert gpu["mp_policy"].param_dtype == torch.bfloat16 and gpu["mp_policy"].reduce_dtype == torch.float32
    cpu = policy("cpu", bf16=True, fp16=False, strategy="fsdp")  # bf16 asked on CPU without the opt-in: fp32
    assert fsdp_policies(t, "cpu", cpu) == {}
    opted_in = policy("cpu", bf16=True, fp16=False, torch_dtype="bfloat16", strategy="fsdp")
    assert fsdp_policies(t, "cpu", opted_in)["mp_policy"].param_dtype == torch.bfloat16


def test_gradient_checkpointing_keeps_the_loss_and_gradients_with_lora(vocab):
    from scaletrain.model.build import build_model
    from scaletrain.worker.step import token_loss_sum

    grads, losses = [], []
    for ckpt in (False, True):
        cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "dropout": 0.0,
                                  "finetuning_type": "lora"}, "data": {"train_file": "x"},
                        "train": {"gradient_checkpointing": ckpt}})
        torch.manual_seed(0)
        model = build_model(cfg.model, Vocab(2048, 0))
        if ckpt:
            from scaletrain.model.build import enable_checkpointing

            enable_checkpointing(model)
            base = model.get_base_model()
            on = getattr(base, "is_activation_checkpointing", None)
            assert (on if on is not None else base.is_gradient_checkpointing) is True  # it is really on
        model.train()
        x = torch.randint(0, 2048, (2, 32), generator=torch.Generator().manual_seed(1))
        loss = token_loss_sum(model(input_ids=x, use_cache=False).logits, x)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], rtol=1e-5, atol=1e-7), n


def test_elastic_ranges_and_their_bad_input():
    from scaletrain.config.batch import for_world_size

    base = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"}, "data": {"train_file": "x"},
            "train": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 3}}
    cfg = validate({**base, "scaling": {"num_workers": [2, 4]}})
    assert cfg.scaling.elastic and (cfg.scaling.min_workers, cfg.scaling.num_workers) == (2, 4)
    on2 = for_world_size(cfg, 2)  # the global batch of 4 workers (24) on 2: accumulation 6, on 3: 4
    assert on2.train.gradient_accumulation_steps == 6 and on2.scaling.num_workers == 2
    assert for_world_size(cfg, 3).train.gradient_accumulation_steps == 4
    assert for_world_size(cfg, 4) is cfg
    fixed = validate({**base, "scaling": {"num_workers": [3, 3]}})
    assert not fixed.scaling.elastic and fixed.scaling.num_workers == 3
    for workers, needle in (([4, 2], r"needs 1 <= min <= max"), ([0, 2], r"needs 1 <= min <= max"),
                            ([1, 2, 3], r"a range is \[min, max\]"),
                            ([5, 6], r"the global batch 36 .* cannot be split over 5 worker\(s\)")):
        with pytest.raises(ConfigError, match=needle):
            validate({**base, "scaling": {"num_workers": workers}})
    nearest = validate({**base, "scaling": {"num_workers": [5, 6], "elastic_batch": "nearest"}})
    assert for_world_size(nearest, 5).train.gradient_accumulation_steps == 4  # 36 / (2 x 5) = 3.6 -> 4
    with pytest.raises(ConfigError, match=r"\(elastic\) needs scaling.launcher=ray"):
        validate({**base, "scaling": {"num_workers": [2, 4], "launcher": "torchrun"}})


def test_a_resume_on_a_size_that_cannot_keep_the_global_batch_is_an_error():
    from scaletrain.config.batch import resized
    from scaletrain.launch.resume import resume_conflicts

    base = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"}, "data": {"train_file": "x"},
            "train": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 3}}
    saved = validate({**base, "scaling": {"num_workers": 2}})  # global batch 12
    four, note = resized(saved, validate({**base, "scaling": {"num_workers": 3}}))
    assert four.train.gradient_accumulation_steps == 2 and "gradient_accumulation_steps 3 -> 2" in note
    assert resume_conflicts(saved, four) == []  # the same global batch: no exact-resume conflict
    with pytest.raises(ConfigError, match=r"num_workers=4: the global batch 12 \(2 per device x 3 accumulation x 2 "
                                          r"workers\) cannot be split over 4 worker\(s\) at 2 per device; use a worker "
                                          r"count that divides 6"):
        resized(saved, validate({**base, "scaling": {"num_workers": 4}}))


def test_the_samples_of_each_step_do_not_depend_on_the_world_size():
    """What makes a resume on another size (elastic or --resume) see every sample once: step k trains on the
    same set of samples on 1, 2 or 4 workers when the global batch is the same."""
    import random

    from scaletrain.worker.sampler import ResumableSampler

    lengths = [random.Random(i).randint(5, 200) for i in range(96)]
    for balanced in (None, lengths):
        def steps(world, accum, balanced=balanced):
            per_rank = [list(ResumableSampler(96, world, r, seed=3, lengths=balanced, batch_size=2,
                                              accumulation=accum)) for r in range(world)]
            per_step = 2 * accum
            return [sorted(i for r in range(world) for i in per_rank[r][k * per_step:(k + 1) * per_step])
                    for k in range(len(per_rank[0]) // per_step)]
        one, two, four = steps(1, 8), steps(2, 4), steps(4, 2)  # global batch 16 each
        assert one == two == four
        seen = [i for s in one for i in s]
        assert len(seen) == len(set(seen)) == 96  # every sample once per epoch


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the resident-set counters are Linux's")
def test_the_cpu_peak_counts_tensors_not_the_file_pages_a_run_touches(tmp_path):
    import mmap

    from scaletrain.memory.measure import PeakMemory

    mib = 2**20
    data = tmp_path / "mapped.bin"
    data.write_bytes(b"\1" * (96 * mib))
    memory = PeakMemory("cpu")
    with open(data, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as pages:
        assert sum(pages[i] for i in range(0, len(pages), 4096)) == 96 * mib // 4096  # every page resident
        assert memory.peak_bytes() < 32 * mib  # mapped pages (library code, arrow data) are not training memory
    x = torch.ones(64 * mib // 4)  # a 64 MiB tensor, freed before the peak is read
    del x
    assert 60 * mib < memory.peak_bytes() < 100 * mib


def test_the_plan_counts_the_preference_reference_and_both_sides_of_a_pair(vocab):
    from scaletrain.memory.plan import advice, shape_for

    shape = _shape(_cfg(), vocab)
    full = estimate(_cfg(stage="dpo"), shape, 1, "gpu")
    assert full.reference == shape.total * 4  # a frozen fp32 copy of the initial model
    assert estimate(_cfg(stage="dpo", strategy="fsdp"), shape, 2, "gpu").reference == shape.total * 4 // 2
    assert estimate(_cfg(stage="dpo", finetuning_type="lora"), shape, 1, "gpu").reference == 0  # adapters off
    assert estimate(_cfg(stage="dpo", pref_loss="simpo"), shape, 1, "gpu").reference == 0
    assert estimate(_cfg(stage="dpo", precompute_ref_logps=True), shape, 1, "gpu").reference == 0
    assert estimate(_cfg(), shape, 1, "gpu").reference == 0
    free = estimate(_cfg(stage="dpo", pref_loss="simpo"), shape, 1, "gpu")
    assert full.train_peak == free.train_peak + full.reference
    # a micro-batch of 4 pairs is 8 sequences: the shape of SFT at batch 8
    dpo = shape_for(_cfg(stage="dpo"), Vocab(vocab, 0))
    assert dpo == model_shape(_cfg(), Vocab(vocab, 0), 8, 512, 8)
    squeezed = type(device_named("a100-40gb"))("test", full.train_peak - full.reference // 2)
    assert "the frozen reference model holds" in advice(_cfg(stage="dpo"), shape, 1, squeezed)


def _grpo(**rl):
    finetuning = rl.pop("finetuning_type", "full")
    return validate({"model": {"name_or_path": "builtin:llama-100m", "task": "causal-lm",
                               "finetuning_type": finetuning},
                     "data": {"train_file": "x.jsonl", "max_length": 256},
                     "train": {"stage": "grpo", "per_device_train_batch_size": 8, "per_device_eval_batch_size": 8},
                     "rl": {"num_generations": 8, "max_completion_length": 256, **rl}, "scaling": {"num_workers": 2}})


def test_the_plan_knows_grpo_a_sequence_its_reference_and_the_rollouts_cache(vocab):
    """#61: a GRPO sequence is a prompt and its completion (256 + 256 here); full fine-tuning with beta > 0 holds a
    frozen reference (LoRA: the adapter off, none); sampling colocated holds the micro-batch's KV cache over every
    layer and one position's fp32 logits with their softmax: layers x rows x tokens x 2 x kv width x bytes."""
    from scaletrain.memory.estimate import rollout_bytes
    from scaletrain.memory.plan import shape_for

    shape = shape_for(_grpo(beta=0.04), Vocab(vocab, 0))
    assert shape.seq == 512 and shape == model_shape(_grpo(), Vocab(vocab, 0), 8, 512, 8)
    full = estimate(_grpo(beta=0.04), shape, 1, "gpu")
    assert full.reference == shape.total * 4
    assert estimate(_grpo(beta=0.0), shape, 1, "gpu").reference == 0
    assert estimate(_grpo(beta=0.04, finetuning_type="lora"), shape, 1, "gpu").reference == 0
    kv = shape.layers * 8 * 512 * 2 * shape.kv_width * 4  # fp32 on a GPU without bf16 asked
    assert rollout_bytes(_grpo(), shape, 4) == kv + 2 * 8 * vocab * 4
    sft = validate({"model": {"name_or_path": "builtin:llama-100m", "task": "causal-lm"},
                    "data": {"train_file": "x.jsonl", "max_length": 256}})
    assert shape_for(sft, Vocab(vocab, 0)).seq == 256  # an SFT sequence is max_length alone


def _with_rollout(cfg, **rollout):
    return cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update=rollout)})


def test_the_plan_knows_where_the_rollout_engine_holds_memory(vocab):
    """#61 item 7: a separate engine's actors hold the model and a micro-batch's KV cache on devices of their own
    (none on the training devices); a colocated vLLM holds its reserved share beside the training peak, which the
    plan adds up and refuses past the device; the hf engine colocated is a phase of the estimate (no line)."""
    from scaletrain.memory.estimate import rollout_bytes
    from scaletrain.memory.plan import rollout_engine_line, shape_for

    cfg = _grpo(finetuning_type="lora")
    shape = shape_for(cfg, Vocab(vocab, 0))
    h100 = device_named("h100")
    assert rollout_engine_line(cfg, shape, 2, h100) is None
    separate = _with_rollout(cfg, placement="separate", num_workers=2)
    assert "rollout" not in estimate(separate, shape, 2, "gpu").as_dict().get("phase", "")
    assert estimate(separate, shape, 2, "gpu").peak <= estimate(cfg, shape, 2, "gpu").peak
    ok, line = rollout_engine_line(separate, shape, 2, h100)
    need = shape.total * 4 + rollout_bytes(cfg, shape, 4)  # fp32: the config asks no bf16
    assert ok and line.startswith(f"rollout actors (separate, 2): {need / 2**30:.1f} GiB each")
    vllm = _with_rollout(cfg, engine="vllm", gpu_memory_utilization=0.3)
    ok, line = rollout_engine_line(vllm, shape, 2, h100)
    assert ok and "vLLM (colocated): 0.3 of each GPU" in line and line.endswith(": fits")
    tiny = type(h100)("tiny", need * 2)
    ok, line = rollout_engine_line(_with_rollout(vllm, gpu_memory_utilization=0.3), shape, 2, tiny)
    assert not ok and "raise rollout.gpu_memory_utilization" in line
    ok, line = rollout_engine_line(_with_rollout(vllm, gpu_memory_utilization=0.9), shape, 2, tiny)
    assert not ok and "lower rollout.gpu_memory_utilization or use more devices" in line


def test_the_cost_of_a_job_per_device_count_and_the_cheapest_within_a_deadline():
    """#63: the job's samples fixed (its steps at its workers), at n devices steps x workers / n steps of the step
    time at n; device-hours = hours x n; cost = device-hours x price; the cheapest that fits and meets a deadline."""
    from scaletrain.memory.cost import cheapest, job_rows, parse_prices
    from scaletrain.memory.plan import device_named

    rows = job_rows({1: 2.0, 2: 1.1, 4: 0.6}, steps=3600, workers=2, price=3.0, fits={1: False, 2: True, 4: True})
    two = rows[1]
    assert two["hours"] == pytest.approx(3600 * 2 / 2 * 1.1 / 3600) and two["device_hours"] == pytest.approx(2.2)
    assert two["cost"] == pytest.approx(6.6) and rows[2]["hours"] == pytest.approx(0.3)  # 1800 steps x 0.6 s
    other = job_rows({2: 0.9, 4: 0.5}, steps=3600, workers=2, price=5.0, fits={2: True, 4: True})
    both = {"MI300X": rows, "H100-SXM": other}
    assert cheapest(both, None) == ("MI300X", rows[2])  # 4 x MI300X: 1.2 device-hours, 3.6 (H100 x 4: 5.0)
    assert cheapest(both, 0.26) == ("H100-SXM", other[1])  # only 4 x H100 finishes in 0.25 h
    assert cheapest(both, 0.1) is None
    assert cheapest({"MI300X": [{**rows[0], "fits": False}]}, None) is None  # what does not fit is no option
    assert parse_prices(["mi300x=3.2", "H100=4.5"], device_named) == {"MI300X": 3.2, "H100-SXM": 4.5}
    for bad, said in (("mi300x", "give DEVICE=PRICE_PER_DEVICE_HOUR"), ("mi300x=-1", "must be > 0"),
                      ("cpu=1", "not cpu"),
                      ("mi3000x=2", "--price mi3000x=2: no memory size known for it; did you mean mi300x")):
        with pytest.raises(ConfigError, match=said):
            parse_prices([bad], device_named)


def test_plan_prices_devices_side_by_side(tmp_path, capsys):
    from scaletrain.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {name_or_path: 'builtin:llama-100m', task: causal-lm}\n"
                   "data: {train_file: x.jsonl, max_length: 512}\n"
                   "train: {bf16: true, per_device_train_batch_size: 4, max_steps: 1000}\nscaling: {num_workers: 2}\n")
    assert main(["plan", str(cfg), "--gpus", "1,2,4", "--price", "mi300x=3.2", "--price", "h100=4.5",
                 "--deadline", "10"]) == 0
    out = capsys.readouterr().out
    assert "cost of 1000 steps at 2 worker(s)" in out and "MI300X" in out and "H100-SXM" in out
    assert "cheapest within 10 h:" in out
    assert main(["plan", str(cfg), "--deadline", "3"]) != 0
    assert "--deadline and --steps go with --price" in capsys.readouterr().err


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
@pytest.mark.parametrize("size", ["8b", "70b"])
def test_the_plan_counts_a_qlora_base_in_4_bits(tmp_path, size):
    """QLoRA (#63): Llama-3-8B on one 24 GB card and Llama-3.1-70B on 2 x 80 GB, from their configs alone; the
    parameters' bytes are the arithmetic below: each decoder block's 7 linear weights in NF4 (4 bits + an int8
    scale per 64 values + an fp32 factor per 256 scales), embeddings/head/norms in bf16, LoRA fp32 masters."""
    from transformers import LlamaConfig

    from scaletrain.model.quantize import NF4_BYTES

    hidden, inter, layers, heads = (4096, 14336, 32, 32) if size == "8b" else (8192, 28672, 80, 64)
    LlamaConfig(vocab_size=128256, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=8, max_position_embeddings=8192,
                tie_word_embeddings=False).save_pretrained(tmp_path)
    kv = 8 * hidden // heads
    per_block = 2 * hidden * hidden + 2 * kv * hidden + 3 * hidden * inter  # q, o; k, v; gate, up, down
    r = 16
    lora = layers * r * (2 * (2 * hidden) + 2 * (hidden + kv) + 3 * (hidden + inter))
    devices = 1 if size == "8b" else 2
    cfg = validate({"model": {"name_or_path": str(tmp_path), "task": "causal-lm", "finetuning_type": "lora",
                              "lora_rank": r, "quantization_bit": 4},
                    "data": {"train_file": "x.jsonl", "max_length": 2048},
                    "train": {"bf16": True, "gradient_checkpointing": True, "per_device_train_batch_size": 1,
                              "per_device_eval_batch_size": 1, "strategy": "fsdp" if devices > 1 else "ddp"},
                    "scaling": {"num_workers": devices}})
    shape = model_shape(cfg, Vocab(128256, 0), 1, 2048, 1)
    assert shape.quantized == layers * per_block and shape.trainable == lora
    rest = shape.total - shape.quantized - lora  # embeddings, output layer, norms
    assert rest == 2 * 128256 * hidden + (2 * layers + 1) * hidden
    expected = lora * 4 + shape.quantized * NF4_BYTES + rest * 2
    plan = estimate(cfg, shape, devices, "gpu")
    assert plan.parameters == int(expected) // devices
    bf16_lora = estimate(cfg.model_copy(update={"model": cfg.model.model_copy(update={"quantization_bit": None})}),
                         shape.__class__(**{**shape.__dict__, "quantized": 0, "block_quantized": 0}), devices, "gpu")
    assert plan.parameters < 0.4 * bf16_lora.parameters  # the base: ~4x smaller, embeddings and head aside
    # 8B: 7.9 GiB against 17.6 GiB for bf16 LoRA; 70B on 2: 29.1 GiB each against 79.3 GiB (no room left on 80)
    card = 24 if size == "8b" else 80
    assert plan.peak < card * GIB and plan.peak < 0.5 * bf16_lora.peak
    assert size == "8b" or bf16_lora.peak > 0.95 * card * GIB
