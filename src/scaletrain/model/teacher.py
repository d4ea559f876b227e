"""The teacher of ``train.stage: distill`` (#74), checked in the driver before any worker starts: it must exist and
share the student's tokenizer (the teacher scores the very token ids the student samples: one vocabulary)."""

from __future__ import annotations

from scaletrain.errors import ConfigError


def check_teacher(name: str, tokenizer) -> str:
    """A line naming the teacher; ConfigError (one line) when it cannot be read or its tokenizer differs."""
    from scaletrain.model.build import auto_and_config
    from scaletrain.model.tokenizer import load_tokenizer

    try:
        theirs = load_tokenizer(name)
    except Exception as e:  # noqa: BLE001 - a missing directory, no tokenizer files: said with the key
        raise ConfigError(f"rl.teacher_model={name}: cannot be read ({type(e).__name__}: "
                          f"{(str(e).splitlines() or [''])[0][:160]}); give the teacher's model directory") from None
    mine, other = tokenizer.get_vocab(), theirs.get_vocab()
    if mine != other:
        differ = sorted(set(mine.items()) ^ set(other.items()), key=lambda kv: kv[1])
        token = differ[0][0] if differ else "?"
        raise ConfigError(f"rl.teacher_model={name}: its tokenizer is not the student's ({len(other):,} tokens there, "
                          f"{len(mine):,} here; {token!r} is id {other.get(token)} there and {mine.get(token)} here): "
                          f"the teacher scores the student's token ids; use a teacher of the student's tokenizer")
    from scaletrain.config.schema import ModelConfig
    from scaletrain.model.tokenizer import Vocab

    _, config = auto_and_config(ModelConfig(name_or_path=name, task="causal-lm"), Vocab.of(theirs))
    layers = getattr(config.get_text_config(), "num_hidden_layers", "?")
    return f"teacher: {name} ({config.model_type}, {layers} layers), the student's tokenizer"


def teacher_parameters(name: str) -> int:
    """The teacher's parameter count, from its config alone (built on the meta device: what `plan` counts)."""
    import torch

    from scaletrain.config.schema import ModelConfig
    from scaletrain.model.build import auto_and_config
    from scaletrain.model.tokenizer import Vocab, load_tokenizer

    auto, config = auto_and_config(ModelConfig(name_or_path=name, task="causal-lm"), Vocab.of(load_tokenizer(name)))
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())
