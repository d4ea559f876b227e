"""QLoRA's 4-bit base (#63): torchao's NF4 under the decoder blocks' linear layers, LoRA on top, and every
combination that cannot run said in one line before a worker starts."""

import json

import pytest
import torch

from scaletrain.config import validate
from scaletrain.errors import ConfigError
from scaletrain.memory.measure import stored_bytes
from scaletrain.model import quantize as q
from scaletrain.model.build import build_model
from scaletrain.model.frozen_base import quantization_note
from scaletrain.model.quantize import prequantized_error
from scaletrain.model.tokenizer import Vocab, tiny_llama_tokenizer
from tests.conftest import save_tiny_llama

pytest.importorskip("torchao")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("ckpt") / "tiny-llama")


def _model_cfg(path, **over):
    model = {"name_or_path": str(path), "task": "causal-lm", "finetuning_type": "lora", "quantization_bit": 4,
             **over}
    return validate({"model": model, "data": {"train_file": "x.jsonl"}}).model


def test_the_base_is_4_bit_frozen_and_lora_trains_on_top(tiny_llama):
    cfg = _model_cfg(tiny_llama)
    vocab = Vocab.of(tiny_llama_tokenizer())
    model = build_model(cfg, vocab, quantize="torchao")
    quantized = model.scaletrain_quantized
    assert (quantized.layers, quantized.kept) == (14, ())  # 2 blocks x (q, k, v, o, gate, up, down)
    weights = [p for n, p in model.named_parameters() if q.is_nf4(p)]
    nf4, bf16 = sum(stored_bytes(p) for p in weights), sum(p.numel() * 2 for p in weights)
    # 4 bits + an int8 scale per 64 values + an fp32 factor per 256 scales, against 16 bits
    assert bf16 == quantized.params * 2 and nf4 == pytest.approx(quantized.params * q.NF4_BYTES, rel=1e-3)
    assert nf4 / bf16 == pytest.approx(0.258, abs=1e-3)
    assert len(weights) == 14 and not any(p.requires_grad for p in weights)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 and not q.is_nf4(p) for p in trainable)
    ids = torch.randint(0, 2048, (2, 16), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters()
               if p.requires_grad and "lora_B" in n)
    assert all(p.grad is None for p in weights)


def test_nf4_forward_is_close_to_the_bf16_base(tiny_llama):
    """The quantized model computes nearly what the base does (NF4's error, not a broken layer)."""
    cfg = _model_cfg(tiny_llama, finetuning_type="lora")
    vocab = Vocab.of(tiny_llama_tokenizer())
    plain = build_model(cfg.model_copy(update={"quantization_bit": None}), vocab)
    four = build_model(cfg, vocab, quantize="torchao")
    ids = torch.randint(0, 2048, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = plain(input_ids=ids).logits, four(input_ids=ids).logits
    assert not torch.equal(a, b)
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.97  # 0.982 measured


def test_the_start_line_counts_what_is_quantized_and_kept(tiny_llama, tmp_path):
    vocab = Vocab.of(tiny_llama_tokenizer())
    note = quantization_note(_model_cfg(tiny_llama), vocab, gpu=False, strategy="ddp", world_size=1)
    assert note.startswith("qlora: 14 linear layers of the decoder blocks in NF4 via torchao (1,179,648 parameters")
    # k_proj/v_proj of a 128-wide model hold 64 x 128 = 8192 values: not one 16384-value scale group; kept, and said
    small = save_tiny_llama(tmp_path / "small", hidden=128, intermediate=256)
    note = quantization_note(_model_cfg(small), vocab, gpu=False, strategy="ddp", world_size=1)
    assert "10 linear layers" in note and "4 kept in their dtype" in note and "self_attn.k_proj" in note


def test_fsdp_shards_that_do_not_divide_are_one_line(tiny_llama):
    vocab = Vocab.of(tiny_llama_tokenizer())
    with pytest.raises(ConfigError, match=r"under FSDP2: .*k_proj: 128 rows and 2 NF4 scale groups do not divide "
                                          r"over 4 ranks; set train.strategy: ddp"):
        quantization_note(_model_cfg(tiny_llama), vocab, gpu=False, strategy="fsdp", world_size=4)
    assert quantization_note(_model_cfg(tiny_llama), vocab, gpu=False, strategy="fsdp", world_size=2)


@pytest.mark.parametrize("over,gpu,match", [
    ({"quantization_method": "bnb"}, False, "bitsandbytes: its kernels need a CUDA or ROCm GPU"),
    ({"quantization_bit": 8}, False, "8-bit \\(LLM.int8\\) is bitsandbytes. \\(GPUs\\)"),
    ({"quantization_bit": 8}, True, "bitsandbytes is not installed"),
    ({"quantization_bit": 8, "quantization_method": "torchao"}, False, "8-bit \\(LLM.int8\\) is bitsandbytes'"),
    ({"quantization_type": "fp4", "quantization_method": "torchao"}, True, "fp4 is bitsandbytes' format"),
    ({"double_quantization": False}, False, "its NF4 always quantizes the scales again"),
    ({"use_dora": True}, False, "peft's DoRA reads the base weight as a plain tensor"),
])
def test_what_the_engine_cannot_do_is_one_line(tiny_llama, over, gpu, match):
    with pytest.raises(ConfigError, match=match):
        q.engine_for(_model_cfg(tiny_llama, **over), gpu=gpu)


def test_bitsandbytes_asked_where_it_is_not_installed(tiny_llama, monkeypatch):
    real = q.importlib.util.find_spec
    monkeypatch.setattr(q.importlib.util, "find_spec", lambda name: None if name == "bitsandbytes" else real(name))
    with pytest.raises(ConfigError, match="bitsandbytes is not installed; pip install bitsandbytes"):
        q.engine_for(_model_cfg(tiny_llama, quantization_method="bnb"), gpu=True)
    assert q.engine_for(_model_cfg(tiny_llama), gpu=True) == "torchao"  # auto: torchao where bnb is absent


def test_auto_picks_bitsandbytes_on_a_gpu_where_it_is_installed(tiny_llama, monkeypatch):
    real = q.importlib.util.find_spec
    monkeypatch.setattr(q.importlib.util, "find_spec", lambda name: object() if name == "bitsandbytes" else real(name))
    assert q.engine_for(_model_cfg(tiny_llama), gpu=True) == "bnb"
    assert q.engine_for(_model_cfg(tiny_llama), gpu=False) == "torchao"


def test_bitsandbytes_gets_llamafactorys_settings():
    pytest.importorskip("transformers")
    kwargs = q.bnb_kwargs(4, "fp4", False, torch.bfloat16)["quantization_config"]
    assert (kwargs.load_in_4bit, kwargs.bnb_4bit_quant_type, kwargs.bnb_4bit_use_double_quant,
            kwargs.bnb_4bit_compute_dtype) == (True, "fp4", False, torch.bfloat16)
    assert q.bnb_kwargs(8, "nf4", True, torch.bfloat16)["quantization_config"].load_in_8bit


@pytest.mark.parametrize("bits,finetuning,match", [
    (3, "lora", "model.quantization_bit"),
    (4, "full", "model.quantization_bit=4 quantizes a frozen base, and model.finetuning_type=full trains every"),
])
def test_bad_quantization_settings_are_one_line(bits, finetuning, match):
    with pytest.raises(ConfigError, match=match):
        validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "finetuning_type": finetuning,
                            "quantization_bit": bits}, "data": {"train_file": "x.jsonl"}})


def test_a_prequantized_checkpoint_without_its_package_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": {
        "quant_method": "gptq", "bits": 4}}))
    assert "a gptq checkpoint (config.json quantization_config); transformers loads it with gptqmodel, which is " \
           "not installed" in prequantized_error(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert prequantized_error(tmp_path) is None


def test_bitsandbytes_quantizes_as_the_checkpoint_loads_onto_the_rank_gpu(tiny_llama, monkeypatch):
    """quantization_method=bnb: transformers loads the checkpoint with LLaMA-Factory's BitsAndBytesConfig straight
    onto this rank's GPU (a fake from_pretrained records what it was asked: no GPU, no bitsandbytes here); a
    built-in has no checkpoint to load that way, one line."""
    from transformers import AutoModelForCausalLM

    asked = {}

    def fake(path, **kwargs):
        asked.update(kwargs)
        raise RuntimeError("recorded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fake)
    vocab = Vocab.of(tiny_llama_tokenizer())
    with pytest.raises(RuntimeError, match="recorded"):
        build_model(_model_cfg(tiny_llama, quantization_method="bnb", double_quantization=False), vocab,
                    frozen_dtype=torch.bfloat16, quantize="bnb", device="cuda:1")
    config = asked["quantization_config"]
    assert (config.load_in_4bit, config.bnb_4bit_quant_type, config.bnb_4bit_use_double_quant,
            config.bnb_4bit_compute_dtype, asked["device_map"]) == (True, "nf4", False, torch.bfloat16, {"": 1})
    with pytest.raises(ConfigError, match="bnb quantizes a checkpoint as it loads, and builtin:tiny-llama is built "
                                          "from a config; set model.quantization_method: torchao"):
        build_model(_model_cfg("builtin:tiny-llama", quantization_method="bnb"), vocab, quantize="bnb",
                    device="cuda:0")
