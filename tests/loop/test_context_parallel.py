"""Context parallelism's core on 2 and 4 gloo processes: a tiny Llama's token-loss sum and every gradient with each
sequence split over the ranks (ulysses and ring, padded and packed rows, a row length that needs padding to 2N)
equal one process's over the whole batch, to 1e-5. The loss is summed over each rank's shard of shifted targets
and all-reduced, as worker/step.py does."""

import copy
import os

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.slow  # 4 gloo processes for the module, 7 runs over 2-4 of them: the loop tier's budget

IGNORE = -100


@pytest.fixture(scope="module")
def ranks():
    """4 gloo ranks for the module's runs (tests/ranks.py), instead of a fresh spawn per test."""
    from tests.ranks import Ranks

    pool = Ranks(4)
    yield pool
    pool.close()


def _tiny(heads: int = 4, kv_heads: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=16 * heads, num_hidden_layers=2, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=96, attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def _batch(packed: bool, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 256, (2, 13), generator=g)
    labels = ids.clone()
    labels[0, :4] = IGNORE  # a prompt
    labels[1, 9:] = IGNORE  # right padding of a shorter row
    batch = {"input_ids": ids, "labels": labels}
    if packed:  # row 0: examples of 5 and 8 tokens; row 1: 9 tokens, then the padding as its own example
        batch["position_ids"] = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7],
                                              [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3]])
        labels[0, 5] = IGNORE  # an example's first token predicts nothing across the boundary
    else:
        batch["attention_mask"] = (labels != IGNORE).long() | (torch.arange(13) < 9).long()
    return batch


def _reference(model, batch: dict):
    from scaletrain.model.attention import isolate_examples
    from scaletrain.worker.step import token_loss_sum

    if "position_ids" in batch:
        isolate_examples(model)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    loss = token_loss_sum(model(**inputs, use_cache=False).logits, batch["labels"])
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _train_shard_and_compare(model, shard: dict, ref_loss: float, ref_grads: dict, main: bool, out: str) -> None:
    """Forward and backward of this rank's shard; the loss and gradients summed over every rank, compared with the
    reference's (the worst relative gradient difference), saved by the main rank."""
    from scaletrain.model import context_parallel as cp
    from scaletrain.worker.step import token_loss_sum

    cp.set_batch(shard)
    inputs = {k: v for k, v in shard.items() if k in ("input_ids", "position_ids")}
    loss = token_loss_sum(model(**inputs, use_cache=False).logits, shard["shift_labels"], shifted=True)
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    worst = 0.0
    for n, p in model.named_parameters():
        g = p.grad.clone()
        dist.all_reduce(g)
        worst = max(worst, float((g - ref_grads[n]).abs().max() / (ref_grads[n].abs().max() + 1e-12)))
    if main:
        torch.save({"loss": total.item(), "ref_loss": ref_loss, "worst_grad_rel": worst}, out)
    dist.destroy_process_group()


def _worker(rank: int, world: int, method: str, packed: bool, heads: int, kv_heads: int, port: int, out: str):
    from scaletrain.model import context_parallel as cp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = _tiny(heads, kv_heads)
    ref_loss, ref_grads = _reference(copy.deepcopy(model), _batch(packed))
    cp.install(model, cp.Group(world, rank, dist.group.WORLD, method))
    shard = cp.shard_batch(_batch(packed), world, rank)
    assert shard["input_ids"].shape[1] == 16 // world  # 13 padded to a multiple of 2 x ranks (16), split
    _train_shard_and_compare(model, shard, ref_loss, ref_grads, rank == 0, out)


@pytest.mark.parametrize("world,method,packed,heads,kv", [
    (2, "ulysses", False, 4, 2), (2, "ring", False, 4, 2), (2, "ulysses", True, 4, 2), (2, "ring", True, 4, 2),
    (4, "ulysses", True, 4, 2),  # 2 kv heads over 4 ranks: replicated to one per query head
    (4, "ring", False, 6, 3),  # 6 heads: only the ring applies
])
def test_context_parallel_equals_one_rank(ranks, tmp_path, world, method, packed, heads, kv):
    from tests.conftest import free_port

    out = str(tmp_path / "result.pt")
    ranks.run(_worker, world, world, method, packed, heads, kv, free_port(), out)
    r = torch.load(out)
    assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)
    assert r["worst_grad_rel"] < 1e-5, r


def _mesh_worker(rank: int, port: int, out: str):
    """4 ranks as 2 data-parallel groups of 2 context-parallel ranks (the trainer's mesh): data-parallel rank d
    trains batch d, split over its group."""
    from scaletrain.comm.context import DistContext
    from scaletrain.model import context_parallel as cp
    from scaletrain.worker.parallel import context_parallel_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4)
    ctx = DistContext(world_rank=rank, local_rank=rank, world_size=4, local_world_size=4, node_rank=0, device="cpu",
                      backend="gloo", cp_size=2)
    assert (ctx.dp_rank, ctx.cp_rank, ctx.dp_size) == (rank // 2, rank % 2, 2)
    model = _tiny()
    reference = copy.deepcopy(model)
    ref_loss = 0.0
    for d in range(2):  # one process over both data-parallel batches
        loss, _ = _reference(reference, _batch(True, seed=d + 1))
        ref_loss += loss
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}  # accumulated over both batches
    group = context_parallel_group(ctx, "ulysses")
    assert dist.get_process_group_ranks(group.group) == [2 * ctx.dp_rank, 2 * ctx.dp_rank + 1]
    cp.install(model, group)
    shard = cp.shard_batch(_batch(True, seed=ctx.dp_rank + 1), 2, ctx.cp_rank)
    _train_shard_and_compare(model, shard, ref_loss, ref_grads, rank == 0, out)


def test_two_data_parallel_groups_of_two_context_parallel_ranks(ranks, tmp_path):
    from tests.conftest import free_port

    out = str(tmp_path / "result.pt")
    ranks.run(_mesh_worker, 4, free_port(), out)
    r = torch.load(out)
    assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)
    assert r["worst_grad_rel"] < 1e-5, r
