"""The chunked causal-LM loss equals the plain one (loss and gradients) and never holds the whole logits."""

import copy

import pytest
import torch

from scaletrain.config.batch import default_chunk_tokens
from scaletrain.data import IGNORE_INDEX
from scaletrain.errors import ConfigError
from scaletrain.worker.loss import chunked_labels, compile_loss, install
from scaletrain.worker.step import token_loss_sum

VOCAB = 32000


def _llama(tie=False, lora=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=64, tie_word_embeddings=tie))
    if lora:
        from peft import LoraConfig, TaskType, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type=TaskType.CAUSAL_LM, r=4, target_modules="all-linear"))
    return model


def _batch(packed: bool):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 24), generator=g)
    labels = ids.clone()
    labels[:, :5] = IGNORE_INDEX  # a prompt
    labels[1, 18:] = IGNORE_INDEX  # padding
    batch = {"input_ids": ids}
    if packed:  # two examples in each row, attention kept apart by position ids
        batch["position_ids"] = torch.cat([torch.arange(10), torch.arange(14)]).repeat(2, 1)
    return batch, labels


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("variant", ["full", "tied", "lora", "step"])
def test_chunked_loss_and_gradients_equal_the_plain_path(packed, variant):
    plain = _llama(tie=variant == "tied", lora=variant == "lora")
    chunked = copy.deepcopy(plain)
    install(chunked, chunk_tokens=7)  # an odd chunk: the last one is partial
    if variant == "step":  # train.compile's per-chunk step (here uncompiled: its math; compiled in the loop tier)
        compile_loss(chunked, lambda fn: fn)
    batch, labels = _batch(packed)
    ref = token_loss_sum(plain(**batch, use_cache=False).logits, labels)
    with chunked_labels(chunked, labels):
        got = chunked(**batch, use_cache=False).logits
    assert got.dtype == torch.float32 and got.item() == pytest.approx(ref.item(), rel=1e-5)
    ref.backward()
    got.backward()
    grads = {n: p.grad for n, p in plain.named_parameters() if p.requires_grad}
    for n, p in chunked.named_parameters():
        if p.requires_grad:  # output layer, embeddings (tied or not), blocks, adapters
            assert (p.grad - grads[n]).norm().item() <= 1e-5 * grads[n].norm().item(), n  # (LoRA's A starts at 0)
    assert chunked.get_output_embeddings().labels is None  # outside the context: the plain linear again
    assert chunked(**batch).logits.shape == (2, 24, VOCAB)


def test_a_chunks_logits_are_not_kept_for_backward():
    """What autograd keeps for backward is the chunk's inputs, never a [tokens x vocab] tensor."""
    model = _llama()
    install(model, chunk_tokens=8)
    batch, labels = _batch(False)
    def logits_kept(run) -> list:
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
            run()
        return [s for s in shapes if s and s[-1] == VOCAB]  # [..., vocab]: logits (the weight is [vocab, hidden])

    def chunked_run():
        with chunked_labels(model, labels):
            model(**batch, use_cache=False).logits.backward()

    assert logits_kept(chunked_run) == []
    # the test can fail: the plain path keeps the whole [2 x 23, vocab] shifted logits for backward
    plain = logits_kept(lambda: token_loss_sum(_llama()(**batch, use_cache=False).logits, labels))
    assert (2 * 23, VOCAB) in plain


def test_the_default_chunk_follows_the_vocabulary_and_bad_layers_are_named():
    assert default_chunk_tokens(2048) == 2**28 // (4 * 2048) and default_chunk_tokens(32000) > 0  # every vocabulary
    assert default_chunk_tokens(128256) * 128256 * 4 <= 2**28  # one chunk's fp32 logits at most 256 MiB
    model = _llama()
    model.lm_head = torch.nn.Sequential(model.lm_head)
    with pytest.raises(ConfigError, match=r"output layer of LlamaForCausalLM is Sequential, not a plain Linear; set "
                                          r"train.loss_chunk_tokens=0"):
        install(model, 8)


def test_a_negative_chunk_is_refused_at_load():
    from scaletrain.config import validate

    with pytest.raises(ConfigError, match=r"train.loss_chunk_tokens=-1 is not valid"):
        validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"}, "data": {"train_file": "x"},
                  "train": {"loss_chunk_tokens": -1}})


def test_one_chunks_logits_at_a_time(monkeypatch):
    """A chunk's logits (made the softmax in place) are gone before the next chunk's exist, with gradients or
    without (evaluation): the peak is one chunk, not two (benchmarks/memory.py --part vocab: 11.6x below plain)."""
    import weakref

    from scaletrain.worker import loss

    made, alive_at_each = [], []

    def tracked(*args):
        alive_at_each.append(sum(ref() is not None for ref in made))
        out = real(*args)
        made.append(weakref.ref(out))
        return out

    real = loss._logits
    monkeypatch.setattr(loss, "_logits", tracked)
    hidden, weight = torch.randn(1, 41, 16, requires_grad=True), torch.randn(VOCAB, 16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (1, 41))  # 40 targets
    loss.chunked_loss_sum(hidden, weight, None, labels, 8).backward()
    with torch.no_grad():
        loss.chunked_loss_sum(hidden, weight, None, labels, 8)
    assert alive_at_each == [0] * 10  # 5 chunks of 8 rows, twice


def test_the_plan_counts_the_logits_with_and_without_chunking(tmp_path):
    """A 128k vocabulary with few layers, cutoff 2048: the logits/loss term dominates the plain plan; chunked, it
    is one chunk's logits (and the evaluation at its batch size no longer the peak)."""
    from transformers import LlamaConfig

    from scaletrain.config import validate
    from scaletrain.memory.estimate import estimate
    from scaletrain.memory.plan import shape_for
    from scaletrain.model.tokenizer import plan_vocab

    d = tmp_path / "big-vocab"
    LlamaConfig(vocab_size=128256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False).save_pretrained(d)

    def plan(chunk):
        cfg = validate({"model": {"name_or_path": str(d), "task": "causal-lm"},
                        "data": {"train_file": "x", "max_length": 2048},
                        "train": {"per_device_train_batch_size": 1, "per_device_eval_batch_size": 16,
                                  "loss_chunk_tokens": chunk}})
        return estimate(cfg, shape_for(cfg, plan_vocab(str(d))), 1, "gpu")

    plain, chunked = plan(0), plan(None)
    logits = 2048 * 128256 * 4
    assert plain.phase == "eval" and plain.activations >= 2 * 16 * logits  # 16 sequences' logits and softmax
    assert chunked.phase != "eval" and chunked.activations * 4 <= plain.activations
    assert plan(512).activations < plain.activations - logits  # neither the logits' gradient nor the log-softmax


def test_the_loss_backend_is_liger_only_where_it_is_installed_and_a_gpu_runs_it():
    from scaletrain.worker.loss import choose_backend

    assert choose_backend("auto", installed=True, on_gpu=True) == "liger"
    assert choose_backend("auto", installed=True, on_gpu=False) == "chunked"  # Triton kernels: GPUs only
    assert choose_backend("auto", installed=False, on_gpu=True) == "chunked"
    assert choose_backend("chunked", installed=True, on_gpu=True) == "chunked"
    assert choose_backend("liger", installed=True, on_gpu=True) == "liger"
    with pytest.raises(ConfigError, match=r"^train.loss_backend=liger: liger-kernel is not installed.*kernels"):
        choose_backend("liger", installed=False, on_gpu=True)
    with pytest.raises(ConfigError, match=r"^train.loss_backend=liger: .*GPUs only.*loss_backend=chunked"):
        choose_backend("liger", installed=True, on_gpu=False)


def test_the_liger_backend_gets_only_the_target_rows_and_sums_as_ours(monkeypatch):
    """liger-kernel needs Triton and a GPU: a stand-in with its module path and call signature (weight, input,
    target, bias) computes the plain cross-entropy, so what the output layer hands it is checked here."""
    import sys
    import types

    calls = []

    class FakeLiger(torch.nn.Module):
        def __init__(self, ignore_index=-100, reduction="mean"):
            super().__init__()
            self.ignore_index, self.reduction = ignore_index, reduction

        def forward(self, lin_weight, _input, target, bias=None):
            calls.append((self.ignore_index, self.reduction, tuple(_input.shape), int((target < 0).sum())))
            logits = torch.nn.functional.linear(_input, lin_weight, bias).float()
            return torch.nn.functional.cross_entropy(logits, target, ignore_index=self.ignore_index,
                                                     reduction=self.reduction)

    package = types.ModuleType("liger_kernel")
    package.transformers = types.ModuleType("liger_kernel.transformers")
    package.transformers.LigerFusedLinearCrossEntropyLoss = FakeLiger
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", package.transformers)

    batch, labels = _batch(packed=False)
    sums = {}
    for backend in ("chunked", "liger"):
        model = _llama()
        install(model, 7, backend)
        with chunked_labels(model, labels):
            sums[backend] = model(**batch).logits
        sums[backend].backward()
        sums[backend + " grad"] = model.lm_head.weight.grad.clone()
    targets = int((labels[:, 1:] != IGNORE_INDEX).sum())
    assert calls == [(IGNORE_INDEX, "sum", (targets, 32), 0)]  # only the target positions, no ignored label
    assert sums["liger"].item() == pytest.approx(sums["chunked"].item(), rel=1e-5)
    torch.testing.assert_close(sums["liger grad"], sums["chunked grad"], rtol=1e-4, atol=1e-6)
