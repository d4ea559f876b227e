"""The training stages (``train.stage``, LLaMA-Factory's names) and which of them train on preference data: one
list, read by the schema (the allowed values), the batch arithmetic (a pair is two sequences) and the data and
worker code that treat pairs."""

STAGES = ("sft", "dpo", "kto", "rm", "grpo", "distill")
# prompts in, completions sampled by the policy (rl: and rollout: sections): rewarded (grpo), or scored token by
# token by a teacher (distill: on-policy distillation, TRL's GKD)
RL_STAGES = ("grpo", "distill")
PAIR_STAGES = ("dpo", "rm")  # train.stage values that train on chosen/rejected pairs
PREFERENCE_STAGES = (*PAIR_STAGES, "kto")  # ... and KTO's single replies tagged desirable or not
