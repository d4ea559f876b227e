"""Building the model: a local model directory's facts (``files``), the tokenizer, the precision policy and its
dtype table, LoRA's targets (dense and fused MoE experts), attention kernels and context parallelism, and the
model itself (``build``). Nothing here knows a rank or a launcher; the worker and the planner call in."""
