"""For benchmarks/gpu_check.sh: the models it trains, built from a config and saved in bf16 first, as a real hub
checkpoint arrives (never downloaded).

    python benchmarks/gpu_models.py OUT [--small]

OUT/llama-1b: builtin:llama-1b's shape (~0.9B parameters, 16 x d2048, GQA), bf16 safetensors, the tiny-llama
tokenizer. OUT/llama-128k: a Llama with a 128,256-token vocabulary and 2 small layers (the logits dominate), bf16.
``--small``: both at a test's size (the suite runs the check on CPU).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(out: Path, small: bool) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    tok = tiny_llama_tokenizer()
    shapes = {
        "llama-1b": dict(vocab_size=len(tok), hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
                         num_key_value_heads=8, intermediate_size=5632),
        "llama-128k": dict(vocab_size=128256, hidden_size=512, num_hidden_layers=2, num_attention_heads=8,
                           num_key_value_heads=4, intermediate_size=1024),
    }
    for name, shape in shapes.items():
        if small:  # the 1B's blocks NF4-sized (multiples of 16384 values), for the qlora part
            wide = name == "llama-1b"
            shape = {**shape, "hidden_size": 256 if wide else 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "intermediate_size": 512 if wide else 128}
        torch.manual_seed(0)
        config = LlamaConfig(**shape, max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
                             tie_word_embeddings=False)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(out / name)
        tok.save_pretrained(out / name)
        print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, bf16, in {out / name}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--small" in sys.argv[2:])
