"""The `rl` and `rollout` sections (train.stage: grpo): TRL's GRPOConfig names for the algorithm, and the engine
that samples completions (`rollout`), validated at load with the key and the allowed values in each error."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from scaletrain.config.base import _Section

# TRL 1.13's loss_type names (trl/trainer/grpo_config.py); GSPO is importance_sampling_level: sequence.
LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo")
NOT_YET = {"luspo": "LUSPO", "vespo": "VESPO"}
BUILTIN_REWARDS = ("accuracy", "format", "length")


class RLConfig(_Section):
    reward_funcs: list[str] = Field(default_factory=lambda: ["accuracy"], description=(
        "Reward functions, summed with reward_weights: built-ins (`accuracy`: the final answer checked against the "
        "data's answer column with math-verify where installed, else by the last number or `\\boxed{}` / "
        "`<answer>`; `format`: think/answer tags; `length`: a penalty past max_completion_length / 2) or "
        "`path/to/file.py:function` with TRL's signature (prompts, completions, the data's other columns as keyword "
        "arguments; a list of floats or None)."))
    reward_weights: Optional[list[float]] = Field(None, description=(
        "One weight per reward function (TRL's name); unset: 1 each."))
    num_generations: int = Field(8, ge=2, description=(
        "Completions sampled per prompt (a group); must divide train.per_device_train_batch_size, which counts "
        "completions, so every group is on one rank."))
    max_completion_length: int = Field(256, ge=1, description="Tokens a completion may have at most.")
    beta: float = Field(0.0, ge=0, description=(
        "grpo: the KL coefficient to the reference (k3 estimator, TRL's); 0 skips the reference pass. With LoRA the "
        "reference is the base with the adapter off (no second copy). distill: the generalized JSD's interpolation "
        "(TRL's GKD beta: 0 the forward KL(teacher || student), 1 the reverse KL(student || teacher); 0.5, GKD's "
        "default, when not set)."))
    epsilon: float = Field(0.2, gt=0, lt=1, description=(
        "The clipping range's low side (and high side, unless epsilon_high)."))
    epsilon_high: Optional[float] = Field(None, gt=0, description=(
        "The clipping range's high side (DAPO's clip-higher: 0.28); unset: epsilon. `cispo`: the ratio's cap."))
    loss_type: str = Field("dapo", description=(
        "TRL's loss: grpo (per-sequence mean), dapo (token mean over the global batch; TRL's default), dr_grpo "
        "(sum / (sequences x max_completion_length)), bnpo (token mean), cispo (clipped-ratio REINFORCE), sapo "
        "(soft gate). Every normalisation is over the global batch: 1 and N workers optimise the same loss."))
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description=(
        "Advantages: reward minus its group's mean, divided by the group's std (group), the batch's std (batch), "
        "or not divided (none, Dr. GRPO). TRL's true/false mean group/none."))
    num_iterations: int = Field(1, ge=1, description=(
        "Optimisation steps per generation batch (TRL's mu): each window of prompts is answered once and trained "
        "on this many steps, the importance ratio against the policy that sampled them (an epoch has mu x the "
        "steps)."))
    importance_sampling_level: Literal["token", "sequence"] = Field("token", description=(
        "token (GRPO's per-token ratio) or sequence (GSPO: one ratio per completion, its tokens' geometric mean)."))
    mask_truncated_completions: bool = Field(False, description=(
        "Completions cut at max_completion_length take no part in the loss (DAPO's overlong filtering)."))
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the rollouts.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling's top-p of the rollouts.")
    sapo_temperature_pos: float = Field(1.0, gt=0, description="sapo: the gate's temperature for positive advantages.")
    sapo_temperature_neg: float = Field(1.05, gt=0, description="sapo: the gate's temperature for negative advantages.")
    vllm_importance_sampling_correction: bool = Field(True, description=(
        "Correct for the sampler not being the policy that trains (TRL's name): each completion token's loss weighted "
        "by the trainer's over the sampler's probability of it, as vllm_importance_sampling_mode says. Applied where "
        "they differ: rollout.engine=vllm, or rollout.max_staleness > 0 (the hf engine at staleness 0 samples with "
        "the trainer's own weights)."))
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = (
        Field("sequence_mask", description=(
            "token_* : a ratio per token; sequence_* : one per completion (the product of its tokens' ratios); "
            "*_truncate clips the ratio to [clip_min, clip_max], *_mask zeroes the tokens (completions) outside it "
            "(TRL 1.13's modes and default).")))
    vllm_importance_sampling_clip_max: Optional[float] = Field(3.0, gt=0, description=(
        "The importance ratio's upper bound (TRL's C_max; none: no upper bound)."))
    vllm_importance_sampling_clip_min: Optional[float] = Field(None, ge=0, description=(
        "The importance ratio's lower bound (TRL's C_min; none: no lower bound)."))
    off_policy_mask_threshold: Optional[float] = Field(None, ge=0, description=(
        "DeepSeek-V3.2's off-policy sequence mask (TRL's name): a completion with a negative advantage whose mean "
        "per-token KL between the sampler and the policy passes this is left out of the loss."))
    teacher_model: Optional[str] = Field(None, description=(
        "train.stage: distill: the teacher (a model directory or builtin name, TRL's GKD name) that scores every "
        "token the student samples; its tokenizer must be the student's."))
    lmbda: float = Field(1.0, ge=0, le=1, description=(
        "distill: the share of steps trained on the student's own samples (TRL's GKD name; 1: on-policy "
        "distillation). Below 1 (the data's own completions on the other steps) is not supported yet."))
    seq_kd: bool = Field(False, description=(
        "distill: train on the teacher's own samples (TRL's sequence-level KD); not supported yet."))
    tools: list[str] = Field(default_factory=list, description=(
        "Multi-turn tool rollouts (TRL's `tools=`): functions by `path/to/file.py:function`, each declared to the "
        "model in its prompt through the chat template (TRL's rule: the type hints and the docstring's Args make the "
        "schema); a completion's tool calls are run and their replies put in the context, out of the loss, before "
        "the model goes on."))
    environment: Optional[str] = Field(None, description=(
        "Multi-turn rollouts in an environment (TRL's `environment_factory`): a class by `path/to/file.py:Class`, "
        "one instance per completion, `reset(**row)` given the prompt's row before it is answered, its public "
        "methods the tools; a `get_reward()` method is a reward function of its own (weight 1, named by the class)."))
    max_tool_calling_iterations: Optional[int] = Field(None, ge=0, description=(
        "The rounds of tool calls a completion may make (TRL's name; unset: until it makes none or its tokens, tool "
        "replies included, reach max_completion_length)."))
    answer_column: str = Field("answer", description=(
        "The data's reference answer for the `accuracy` reward (LLaMA-Factory rows: their reply)."))
    prompt_column: str = Field("prompt", description=(
        "TRL's prompt-only format: the prompt (text, or a list of messages) rendered through the chat template "
        "with its generation prompt; the other columns go to the reward functions."))

    @field_validator("scale_rewards", mode="before")
    @classmethod
    def _scale(cls, v):
        return {True: "group", False: "none"}.get(v, v)

    @field_validator("loss_type")
    @classmethod
    def _loss(cls, v):
        if v in NOT_YET:
            raise ValueError(f"{v} ({NOT_YET[v]}) is not supported yet; use one of {', '.join(LOSS_TYPES)}")
        if v not in LOSS_TYPES:
            raise ValueError(f"{v!r} is not a loss; use one of {', '.join(LOSS_TYPES)} (TRL's names)")
        return v

    @field_validator("reward_funcs")
    @classmethod
    def _funcs(cls, v):
        for f in v:
            if f not in BUILTIN_REWARDS and ":" not in f:
                raise ValueError(f"{f!r} is neither a built-in ({', '.join(BUILTIN_REWARDS)}) nor "
                                 f"path/to/file.py:function")
        return v

    @field_validator("tools")
    @classmethod
    def _tools(cls, v):
        for f in v:
            if ":" not in f or not f.rpartition(":")[0]:
                raise ValueError(f"{f!r} is not path/to/file.py:function")
        if len(set(v)) != len(v):
            raise ValueError("a tool is named twice; give each once")
        return v

    @field_validator("environment")
    @classmethod
    def _environment(cls, v):
        if v is not None and (":" not in v or not v.rpartition(":")[0]):
            raise ValueError(f"{v!r} is not path/to/file.py:Class")
        return v

    @model_validator(mode="after")
    def _weights(self) -> RLConfig:
        if self.environment and "reward_funcs" not in self.model_fields_set:
            self.reward_funcs = []  # TRL's: an environment that owns its reward (get_reward) may be the only one
        if not self.reward_funcs and not self.environment:
            raise ValueError("rl.reward_funcs is empty: give at least one reward function (or an rl.environment "
                             "with get_reward)")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(f"rl.reward_weights has {len(self.reward_weights)} weights for "
                             f"{len(self.reward_funcs)} reward functions; give one each")
        return self


class RolloutConfig(_Section):
    engine: Literal["hf", "vllm"] = Field("hf", description=(
        "What samples the completions: hf (transformers' generate, CPU and GPU) or vllm (GPUs; the `vllm` extra)."))
    placement: Literal["colocated", "separate"] = Field("colocated", description=(
        "colocated: each training worker samples its own prompts' completions with the policy it trains; "
        "separate: a pool of Ray actors on their own devices (a GPU each, or a CPU core), given the policy before each "
        "rollout (the whole model once, then the trainable tensors: LoRA's adapter only); needs the Ray launcher."))
    num_workers: int = Field(1, ge=1, description=(
        "separate: the rollout actors; training rank i samples on actor i mod num_workers."))
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description=(
        "vllm: the share of the GPU's memory vLLM takes for its weights and KV cache (TRL's "
        "vllm_gpu_memory_utilization), handed back to training between rollouts."))
    max_staleness: int = Field(0, ge=0, description=(
        "Asynchronous GRPO (TRL's AsyncGRPO name): the rollouts of the next steps are sampled while this step "
        "trains, by weights up to this many optimizer steps older than the ones they train (0: every step samples "
        "with the current policy, then trains; 1: verl's one-step-off). Needs placement: separate. Older "
        "completions are dropped (rollout/stale_dropped); the lag is logged (rollout/staleness_mean, _max)."))
    sync_timeout_s: float = Field(300.0, gt=0, description=(
        "separate: a weight sync (or the actors' start) that takes longer fails naming the actor, the version and "
        "the phase, never hangs; an actor that dies fails the wait at once."))
