"""``final/`` of a full fine-tune sharded by FSDP over 2 ranks is written by every rank (DCP's Hugging Face writer,
then each rank assembling its share of the output files): the same files' tensors, bit for bit, as rank 0's
gathered ``save_pretrained`` (the tied weight once), config.json naming the dtype, nothing of the per-rank
pieces left, and transformers loads it. Two gloo processes on this machine, started once for the module
(tests/ranks.py)."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from scaletrain.worker.final import file_of_each

pytestmark = [pytest.mark.loop, pytest.mark.slow]  # two spawned gloo processes (~10 s each)


@pytest.fixture(scope="module")
def ranks():
    """2 gloo ranks for the module (tests/ranks.py), started with glibc's mmap threshold fixed (envvars.py): freed
    tensors leave the resident set, so the memory test measures live memory; the other does not mind."""
    from scaletrain import envvars
    from tests.ranks import Ranks

    before = os.environ.get(envvars.MALLOC_MMAP_THRESHOLD)
    os.environ[envvars.MALLOC_MMAP_THRESHOLD] = str(envvars.CPU_MMAP_THRESHOLD_BYTES)  # read when a process starts
    try:
        pool = Ranks(2)
    finally:
        if before is None:
            os.environ.pop(envvars.MALLOC_MMAP_THRESHOLD)
        else:
            os.environ[envvars.MALLOC_MMAP_THRESHOLD] = before
    yield pool
    pool.close()


def _tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True))


def _fake_trainer(model, root: Path, rank: int, world: int):
    from scaletrain.comm.context import DistContext
    from scaletrain.rundir import RunDir

    root.mkdir(parents=True, exist_ok=True)
    ctx = DistContext(world_rank=rank, local_rank=rank, world_size=world, local_world_size=world, node_rank=0,
                      device="cpu", backend="gloo")
    return SimpleNamespace(model=model, lora=False, ctx=ctx, run_dir=RunDir(root), spec=SimpleNamespace(store=None),
                           cfg=SimpleNamespace(train=SimpleNamespace(strategy="fsdp")))


def _worker(rank: int, world: int, root: str, port: int):
    from torch.distributed.fsdp import fully_shard

    from scaletrain.worker import final

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = _tiny()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    every = _fake_trainer(model, Path(root) / "every", rank, world)
    assert final._every_rank_writes(every)
    final._save_sharded(every, "bf16")
    final._save_gathered(_fake_trainer(model, Path(root) / "gathered", rank, world), "bf16")
    dist.barrier()
    dist.destroy_process_group()


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_two_ranks_write_final_equal_to_save_pretrained(ranks, tmp_path):
    from transformers import AutoModelForCausalLM

    from tests.conftest import free_port

    ranks.run(_worker, 2, 2, str(tmp_path), free_port())
    every, gathered = tmp_path / "every" / "final", tmp_path / "gathered" / "final"
    ours, theirs = _tensors(every), _tensors(gathered)
    # tied: written once (the gathered dict holds two copies, so save_pretrained cannot tell and writes both)
    assert set(ours) == set(theirs) - {"lm_head.weight"}
    for key in ours:
        assert ours[key].dtype == torch.bfloat16 and torch.equal(ours[key], theirs[key]), key
    files = sorted(p.name for p in every.glob("*.safetensors"))
    assert len(files) >= 2 * 4  # four output files per rank at least
    index = json.loads((every / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(ours) and set(index["weight_map"].values()) == set(files)
    assert not (every / "sharded").exists()
    assert json.loads((every / "config.json").read_text())["dtype"] == "bfloat16"
    assert (every / "generation_config.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(every)
    assert torch.equal(loaded.lm_head.weight, loaded.model.embed_tokens.weight)
    reference = _tiny().to(torch.bfloat16).state_dict()
    assert all(torch.equal(loaded.state_dict()[k].to(torch.bfloat16), reference[k]) for k in reference)


def test_output_files_are_about_equal_and_four_per_rank_at_least():
    state = {f"w{i}": torch.empty(100 * (i % 3 + 1)) for i in range(48)}
    mapping = file_of_each(state, 2)
    assert sorted(set(mapping.values())) == list(range(1, 9)) and list(mapping.values()) == sorted(mapping.values())
    sizes = [sum(state[k].numel() for k, f in mapping.items() if f == i) for i in range(1, 9)]
    assert max(sizes) - min(sizes) <= 300  # within one tensor
    assert set(file_of_each({"a": torch.empty(4)}, 4).values()) == {1}  # never an empty file


def _memory_worker(rank: int, world: int, root: str, port: int):
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    from scaletrain.memory.measure import PeakMemory
    from scaletrain.worker import final

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=512, num_hidden_layers=8,
                                         num_attention_heads=8, num_key_value_heads=8, intermediate_size=1536,
                                         tie_word_embeddings=False))  # ~38M parameters: 76 MB in bf16
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    for how in ("every", "gathered"):
        dist.barrier()
        peak = PeakMemory("cpu")
        getattr(final, "_save_sharded" if how == "every" else "_save_gathered")(
            _fake_trainer(model, Path(root) / how, rank, world), "bf16")
        dist.barrier()
        (Path(root) / f"peak-{how}-{rank}").write_text(str(peak.peak_bytes()))
    dist.destroy_process_group()


def test_no_rank_holds_the_whole_model_while_writing_final(ranks, tmp_path):
    """The growth of each rank's peak resident set while it writes final/: under its half of the bf16 model plus
    the largest tensor (and a little for the files' buffers; measured 45 MiB a rank for a 68 MiB model); rank 0's
    gathered save_pretrained takes the whole fp32 model (measured 204 MiB), which is what this test tells apart."""
    from tests.conftest import free_port

    ranks.run(_memory_worker, 2, 2, str(tmp_path), free_port())
    peaks = {f"{how}-{rank}": int((tmp_path / f"peak-{how}-{rank}").read_text())
             for how in ("every", "gathered") for rank in (0, 1)}
    params = sum(t.numel() for t in _tensors(tmp_path / "every" / "final").values())
    bf16, largest = params * 2, 8192 * 512 * 2
    mib = 2**20
    for rank in (0, 1):
        assert peaks[f"every-{rank}"] < bf16 / 2 + largest + 24 * mib, (rank, dict(peaks), bf16)
    assert peaks["gathered-0"] > params * 4 * 0.9, dict(peaks)  # the whole model in fp32 on rank 0
