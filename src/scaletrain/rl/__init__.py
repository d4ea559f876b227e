"""Reinforcement learning with verifiable rewards (train.stage: grpo): the policy losses of GRPO and its variants
(TRL's names and formulas, every normalisation over the global batch), group advantages, and the rewards (built-ins
and TRL-signature user functions). The worker's GRPO objective (worker/grpo.py) samples and calls these."""
