"""``train.compile``: regional compilation, each decoder block through torch.compile (as torchtitan and torchtune
compile theirs): every block has the same code, so dynamo traces one graph that all of them reuse (a few seconds
where the whole model would take minutes), and FSDP2, activation checkpointing and DDP keep working on the blocks
as modules. LoRA layers sit inside the blocks and compile with them; the chunked loss's per-chunk step (the
projection's log-sum-exp, the target's logit and d loss / d logits: worker/loss.py's chunk_step) compiles too, its
loop over chunks (their count follows the batch's targets) and the embeddings staying eager.

A block that cannot compile runs eager: the backend wraps inductor's and, where inductor fails on a graph, returns
that graph's eager code and remembers why (``Compiled.fallback``: one line for the run's events). Where inductor
cannot run at all (no C++ compiler for CPU code, no Triton for GPU code) nothing is compiled, said the same way.
What compiling took is read from dynamo's own timers (its frame compiles and the lazily compiled backward graphs).
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass, field

import torch

from scaletrain import envvars

MIN_TORCH = (2, 4)  # nn.Module blocks compiled in place under FSDP2 (fully_shard on an OptimizedModule)
# dynamo's timers (torch._dynamo.utils.compilation_time_metrics) that add up to the time spent compiling: frames
# traced and compiled in forward, and the backward graphs AOTAutograd compiles at their first backward.
TIMERS = ("_compile.compile_inner", "backward._backward_impl")


def torch_too_old(version: str) -> bool:
    major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    return (major, minor) < MIN_TORCH


def blocker(device: str) -> str | None:
    """Why inductor cannot compile on ``device`` here, or None."""
    if device == "cpu":
        cxx = envvars.read(envvars.CXX) or "g++"  # inductor's own default on Linux (torch._inductor.config.cpp.cxx)
        if not (shutil.which(cxx) or shutil.which("clang++")):
            return f"no C++ compiler ({cxx} or clang++) for inductor's CPU code"
        return None
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (inductor writes GPU kernels in it)"
    return None


@dataclass
class Compiled:
    """What ``compile_blocks`` did: the blocks compiled, and the graphs inductor could not (with why)."""

    blocks: int = 0
    fallback: list[str] = field(default_factory=list)
    skipped: str | None = None  # nothing compiled: why
    packed: bool = False  # packed rows: transformers' masked SDPA (the per-example attention breaks the graph)
    graphs: int = 0  # graphs dynamo handed to the backend
    backend: object = None  # the guarded inductor backend (compile_blocks), for function()
    loss: bool = False  # the chunked loss's per-chunk step compiled too
    said: int = 0  # fallbacks already said
    checked: bool = False  # graph breaks looked at (after the first step)

    def note(self) -> str:
        if self.skipped:
            return f"train.compile: eager ({self.skipped})"
        return (f"train.compile: {self.blocks} decoder blocks compiled regionally" + (
                    " and the chunked loss's per-chunk step" if self.loss else "") +
                " (inductor; the first steps include the compile time, counted apart as goodput/compile_s)" + (
                    "; packed rows attend through transformers' block-diagonal SDPA mask (scaletrain's per-example "
                    "attention splits on data-dependent spans, which breaks the compiled graph)" if self.packed
                    else ""))

    def function(self, fn):
        """``fn`` through torch.compile with the blocks' guarded backend (dynamic shapes); ``fn`` itself where
        nothing compiles here."""
        if self.backend is None:
            return fn
        self.loss = True
        return torch.compile(fn, backend=self.backend, dynamic=True)

    def fallback_note(self) -> str | None:
        """After a step: one line for what runs eager that the run has not said yet (None: nothing new): graphs
        inductor failed on, and, after the first step, graph breaks (dynamo ran part of a block, or none of it,
        eagerly; its first reason named)."""
        if self.skipped:
            return None
        if not self.checked:
            self.checked = True
            breaks = _graph_breaks()
            if breaks and not self.graphs:
                return f"train.compile: nothing compiled, the blocks run eager (dynamo: {breaks[0]})"
            if breaks:
                return (f"train.compile: {len(breaks)} graph break(s) in the blocks, those parts run eager (dynamo: "
                        f"{breaks[0]})")
        if len(self.fallback) <= self.said:
            return None
        new, self.said = self.fallback[self.said:], len(self.fallback)
        return f"train.compile: inductor could not compile {len(new)} graph(s), which run eager ({new[0]})"


def _graph_breaks() -> list[str]:
    """Dynamo's graph-break reasons so far, first lines (its counters; empty where this torch has none)."""
    try:
        from torch._dynamo.utils import counters  # private: named where it is read
    except ImportError:
        return []
    return [str(reason).strip().splitlines()[0][:200] for reason in counters.get("graph_break", {})]


def compile_blocks(block_list: torch.nn.ModuleList, device: str, packed: bool = False) -> Compiled:
    """Replace each module of ``block_list`` (the model's decoder blocks) by its compiled self, in place; the
    state dict's names are kept by torch.distributed.checkpoint's state-dict helpers (they strip ``_orig_mod``).
    ``packed``: the model was built for packed rows without the per-example attention (said in the note)."""
    done = Compiled(packed=packed)
    if why := blocker(device):
        done.skipped = why
        return done

    # HF's checkpointed layers set a context variable (their output recorder) inside the checkpointed region,
    # which dynamo refuses to trace unless it may skip replaying it in the recompute; it records outputs only
    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True

    def backend(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        done.graphs += 1
        try:
            return compile_fx(gm, example_inputs)
        except (torch._dynamo.exc.RestartAnalysis, torch._dynamo.exc.SkipFrame):
            raise  # dynamo's own control flow (trace again, skip the frame), not a failure
        except Exception as e:  # noqa: BLE001 - any inductor failure: this graph runs eager, and the run says so
            done.fallback.append(f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e) else ''}")
            return gm.forward

    for i, block in enumerate(block_list):
        block_list.register_module(str(i), torch.compile(block, backend=backend, dynamic=True))
    done.blocks, done.backend = len(block_list), backend
    return done


def compile_seconds() -> float:
    """Seconds this process has spent compiling so far (dynamo's timers; 0 where this torch has none)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics  # private: named where it is read
    except ImportError:
        return 0.0
    return float(sum(sum(compilation_time_metrics.get(name, ())) for name in TIMERS))
