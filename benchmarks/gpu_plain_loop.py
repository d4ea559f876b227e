"""For benchmarks/gpu_check.sh: the same LoRA SFT step in a plain PyTorch + PEFT loop, written here by hand (the
floor scaletrain's loop is compared with): fp32 master weights, bf16 autocast on a GPU, AdamW, LoRA with
scaletrain's defaults (rank 8, alpha 16, every linear layer), batches of records tokenized to MAX_LENGTH.

    python benchmarks/gpu_plain_loop.py MODEL_DIR DATA_JSONL MAX_LENGTH BATCH STEPS

Prints `plain tokens/s (median): N` over the steps after the first two (warm-up), counting non-padding tokens as
scaletrain's throughput/tokens_per_s does.
"""

from __future__ import annotations

import json
import statistics
import sys
import time


def main(model_dir: str, data: str, max_length: int, batch: int, steps: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    with open(data) as f:
        texts = [f"{r['instruction']}\n{r['output']}" for r in map(json.loads, f)]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    rates = []
    for step in range(steps):
        rows = texts[(step * batch) % len(texts):][:batch] or texts[:batch]
        enc = tok(rows, truncation=True, max_length=max_length, padding=True, return_tensors="pt").to(device)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(**enc, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        rates.append(int(enc["attention_mask"].sum()) / (time.perf_counter() - t0))
    print(f"plain tokens/s (median): {round(statistics.median(rates[2:] or rates))}")


if __name__ == "__main__":
    model_dir, data, max_length, batch, steps = sys.argv[1:6]
    main(model_dir, data, int(max_length), int(batch), int(steps))
