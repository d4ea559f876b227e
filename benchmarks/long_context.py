"""Context parallelism on long sequences (issue #45): a rank's activations and the step time, CP 1 against CP 2.

A tiny Llama (hidden 128, 4 layers, 8 heads, 4 KV heads; fp32 on the CPU) trains one sequence of 8k / 16k / 32k
tokens: whole on one process (2 threads), and split over 2 gloo processes (1 thread each: the same 2 cores) with
scaletrain's context-parallel attention (``ulysses`` and ``ring``). A rank's activations are the bytes autograd
saves for backward during the forward (every saved tensor's storage once, parameters excluded: what the rank
holds at the start of backward), read with ``torch.autograd.graph.saved_tensors_hooks``; the step time is the
median of ``--steps`` forward+backward passes after one warm-up, the slowest rank's. Variants alternate within a
round; medians over rounds.

    python benchmarks/long_context.py --lengths 8192,16384,32768 --steps 2 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RUN = r"""
import json, os, sys, time
import torch, torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM
from scaletrain.model import context_parallel as cp
from scaletrain.worker.step import token_loss_sum

length, method, steps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
world = int(os.environ.get("WORLD_SIZE", "1"))
torch.set_num_threads(2 // world)
if world > 1:
    dist.init_process_group("gloo")
rank = dist.get_rank() if world > 1 else 0
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                     num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=length,
                                     attn_implementation="sdpa"))
ids = torch.randint(0, 2048, (1, length), generator=torch.Generator().manual_seed(1))
batch = {"input_ids": ids, "labels": ids.clone()}
if world > 1:
    cp.install(model, cp.Group(world, rank, dist.group.WORLD, method))
    batch = cp.shard_batch(batch, world, rank)
    cp.set_batch(batch)
    inputs, labels, shifted = {k: batch[k] for k in ("input_ids", "position_ids")}, batch["shift_labels"], True
else:
    inputs, labels, shifted = {"input_ids": ids}, batch["labels"], False
params = {p.untyped_storage().data_ptr() for p in model.parameters()}

def step(count):
    seen, held = set(), [0]
    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params and s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            held[0] += s.nbytes()
        return t
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):  # a set lookup per saved tensor
        loss = token_loss_sum(model(**inputs, use_cache=False).logits, labels, shifted)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start, held[0]

step(True)  # warm-up (and the activation count: the same every step)
_, held = step(True)
times = [step(False)[0] for _ in range(steps)]
import statistics
took = statistics.median(times)
if world > 1:
    t = torch.tensor([took, float(held)], dtype=torch.float64)
    gathered = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(gathered, t)
    took, held = max(float(g[0]) for g in gathered), max(float(g[1]) for g in gathered)
if rank == 0:
    print("RESULT " + json.dumps({"step_s": took, "activations_mb": held / 1e6}))
if world > 1:
    dist.destroy_process_group()
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(length: int, method: str, steps: int, world: int, script: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(OMP_NUM_THREADS=str(2 // world))
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world), "--master-port",
            str(free_port())] if world > 1 else [sys.executable])
    out = subprocess.run([*cmd, str(script), str(length), method, str(steps)], capture_output=True, text=True,
                         env=env, timeout=3600)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise SystemExit(f"{method} x{world} at {length}: failed\n{out.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="8192,16384,32768")
    ap.add_argument("--methods", default="ulysses,ring")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    methods = args.methods.split(",")
    variants = [("cp1", 1)] + [(m, 2) for m in methods]
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "run.py"
        script.write_text(RUN)
        for _ in range(args.rounds):
            for length in lengths:
                for name, world in variants:  # alternating within a round
                    r = run(length, name if world > 1 else "none", args.steps, world, script)
                    results.setdefault((length, name), []).append(r)
                    print(f"  {length:>6} {name:<8} step {r['step_s']:.2f} s, activations {r['activations_mb']:.0f} MB",
                          flush=True)
    print("\n| tokens | variant | step s | x CP 1 | activations per rank MB | x CP 1 |\n|---|---|---|---|---|---|")
    summary = []
    for length in lengths:
        base = {k: statistics.median(r[k] for r in results[(length, "cp1")]) for k in ("step_s", "activations_mb")}
        for name, _ in variants:
            m = {k: statistics.median(r[k] for r in results[(length, name)]) for k in ("step_s", "activations_mb")}
            ratio_t, ratio_m = m["step_s"] / base["step_s"], m["activations_mb"] / base["activations_mb"]
            print(f"| {length} | {name} | {m['step_s']:.2f} | {ratio_t:.2f} | {m['activations_mb']:.0f} | "
                  f"{ratio_m:.2f} |")
            summary.append({"tokens": length, "variant": name, **m, "step_ratio": ratio_t, "activation_ratio": ratio_m})
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
