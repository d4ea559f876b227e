"""The parts of an image-text-to-text model (#62): its vision tower, the projector that maps image features into
the language model, and the language model with its head, found by parameter name for the families transformers
ships; frozen as LLaMA-Factory's ``freeze_vision_tower`` / ``freeze_multi_modal_projector`` /
``freeze_language_model`` say, with the same defaults (the tower and the projector frozen, the language model
trained).

Written here, not taken from LLaMA-Factory's registry (model_utils/visual.py), because that registry names
modules to freeze and misses some: Qwen3-VL's ``visual.pos_embed`` and ``visual.deepstack_merger_list`` are in
none of its keys, so a "frozen" Qwen3-VL tower trains its position embedding. Here every parameter of the model
belongs to exactly one part (by the longest matching prefix), and a parameter that matches none is an error,
never left trainable by omission.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.errors import ConfigError

PART_NAMES = ("vision", "projector", "language")


@dataclass(frozen=True)
class Layout:
    """Parameter-name prefixes of each part (the longest match wins: a projector inside the tower's module)."""

    vision: tuple[str, ...]
    projector: tuple[str, ...]
    language: tuple[str, ...]


_QWEN = Layout(vision=("model.visual.",),
               projector=("model.visual.merger.", "model.visual.deepstack_merger_list."),
               language=("model.language_model.", "lm_head."))
LAYOUTS = {
    "qwen2_vl": _QWEN,
    "qwen2_5_vl": _QWEN,
    "qwen3_vl": _QWEN,
    "qwen3_vl_moe": _QWEN,
    "gemma3": Layout(vision=("model.vision_tower.",), projector=("model.multi_modal_projector.",),
                     language=("model.language_model.", "lm_head.")),
}


def is_vision_language(config) -> bool:
    """A transformers config of an image-text-to-text model (a vision config beside the text one)."""
    return getattr(config, "vision_config", None) is not None


def layout_of(config) -> Layout:
    model_type = getattr(config, "model_type", "?")
    if model_type not in LAYOUTS:
        raise ConfigError(f"model: a vision-language model of type {model_type} is not one scaletrain knows the parts "
                          f"of yet (it knows {', '.join(sorted(LAYOUTS))}); use one of those")
    return LAYOUTS[model_type]


def part_of(name: str, layout: Layout) -> str | None:
    """The part a parameter (or module) name belongs to, by the longest matching prefix; None: no part."""
    name = name.replace("base_model.model.", "", 1) if name.startswith("base_model.model.") else name
    best, length = None, -1
    for part in PART_NAMES:
        for prefix in getattr(layout, part):
            if (name + ".").startswith(prefix) and len(prefix) > length:
                best, length = part, len(prefix)
    return best


def parts(model) -> dict[str, list]:
    """Every parameter by part: {"vision": [(name, parameter)], ...}; one that belongs to no part is an error."""
    layout = layout_of(model.config)
    out: dict[str, list] = {p: [] for p in PART_NAMES}
    for name, p in model.named_parameters():
        part = part_of(name, layout)
        if part is None:
            raise ConfigError(f"model: the parameter {name} of this {model.config.model_type} is in none of its "
                              f"parts (vision, projector, language); a newer transformers layout: report it")
        out[part].append((name, p))
    return out


def freeze(model, vision: bool, projector: bool, language: bool) -> None:
    """Freeze the parts asked (requires_grad off), the others left as they are."""
    frozen = {"vision": vision, "projector": projector, "language": language}
    for part, members in parts(model).items():
        if frozen[part]:
            for _, p in members:
                p.requires_grad_(False)


def counts(model) -> dict[str, tuple[int, int]]:
    """{part: (trainable, total)} parameters."""
    return {part: (sum(p.numel() for _, p in m if p.requires_grad), sum(p.numel() for _, p in m))
            for part, m in parts(model).items()}


def counts_line(model) -> str:
    """What trains, said at start: ``vision 0 of 1.2M, projector 0 of 0.1M, language 12.3M of 12.3M``."""
    def m(n: int) -> str:
        return f"{n / 1e6:.2f}M" if n >= 10_000 else str(n)

    return ", ".join(f"{part} {m(t)} of {m(total)} trainable" for part, (t, total) in counts(model).items())


def unfrozen_targets(model, targets, cfg):
    """LoRA's targets on a vision-language model: the asked linear modules within the parts left unfrozen (the
    language model by default: an adapter on the frozen tower would train what the user froze), as peft's full
    module names; a choice that leaves nothing to adapt is one line."""
    import dataclasses

    import torch

    from scaletrain.model.lora_targets import HEAD_NAMES

    layout = layout_of(model.config)
    open_parts = {p for p, frozen in (("vision", cfg.freeze_vision_tower),
                                      ("projector", cfg.freeze_multi_modal_projector),
                                      ("language", cfg.freeze_language_model)) if not frozen}
    wanted = None if targets.peft_modules == "all-linear" else set(targets.modules)
    names = sorted(n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                   and part_of(n, layout) in open_parts and n.rsplit(".", 1)[-1] not in HEAD_NAMES
                   and (wanted is None or n.rsplit(".", 1)[-1] in wanted or n in wanted))
    if not names:
        parts_open = ", ".join(sorted(open_parts)) or "none"
        raise ConfigError(f"model.lora_target: nothing to adapt in the unfrozen parts ({parts_open}) of this "
                          f"{model.config.model_type}; set model.freeze_language_model: false or name "
                          f"modules of an unfrozen part")
    return dataclasses.replace(targets, modules=names)


def stand_in_image(config):
    """The smallest image this model's tower takes, as a batch carries it (data/collate.py StandIn): Qwen-VL's one
    merged patch (a grid of spatial_merge_size x spatial_merge_size patches: one token), Gemma 3's one image at its
    size (mm_tokens_per_image tokens)."""
    from scaletrain.data.collate import StandIn

    vision = config.vision_config
    if config.model_type == "gemma3":
        return StandIn(config.image_token_index, config.mm_tokens_per_image,
                       (1, vision.num_channels, vision.image_size, vision.image_size))
    layout_of(config)  # a family scaletrain knows
    merge, temporal = vision.spatial_merge_size, vision.temporal_patch_size
    channels = getattr(vision, "in_channels", None) or vision.in_chans
    return StandIn(config.image_token_id, 1, (merge * merge, channels * temporal * vision.patch_size ** 2),
                   (1, merge, merge))


def rope_owner(model, config):
    """The module of a Qwen-VL model (wrapped or not) that computes its M-RoPE positions (``get_rope_index``), or
    None (no M-RoPE)."""
    if config is None or getattr(config, "model_type", None) not in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl",
                                                                    "qwen3_vl_moe"):
        return None
    return next((m for m in model.modules() if hasattr(m, "get_rope_index")), None)


def packed_positions(owner, batch: dict):
    """The (4, batch, length) position ids of packed Qwen-VL rows: the text positions (restarting at each example:
    what keeps the examples apart in attention, transformers' packed-M-RoPE layout), then each example's own 3-D
    M-RoPE positions from the model's ``get_rope_index`` on that example alone (its images' grids in order), so a
    packed example is positioned exactly as it is unpacked. An example without an image: its text positions."""
    import itertools

    import torch

    positions = batch["position_ids"]
    rope = positions[None].repeat(3, 1, 1)
    types = batch.get("mm_token_type_ids")
    grids = iter(batch["image_grid_thw"]) if "image_grid_thw" in batch else iter(())
    if types is not None and bool(types.any()):
        for b in range(positions.shape[0]):
            starts = (positions[b] == 0).nonzero().flatten().tolist() + [positions.shape[1]]
            for s, e in zip(starts[:-1], starts[1:]):
                kinds = types[b, s:e]
                images = sum(1 for k, _ in itertools.groupby(kinds.tolist()) if k == 1)
                if images:
                    grid = torch.stack([next(grids) for _ in range(images)])
                    ids, _ = owner.get_rope_index(batch["input_ids"][b:b + 1, s:e], mm_token_type_ids=kinds[None],
                                                  image_grid_thw=grid)
                    rope[:, b, s:e] = ids[:, 0].to(rope.dtype)
    return torch.cat([positions[None], rope], 0)


def packed_inputs(batch: dict, rope=None, masks_of=None) -> dict:
    """A packed vision-language batch as its model takes it (train and eval): Qwen-VL's rows with each example's
    own M-RoPE positions (``rope``: the model's rope owner), Gemma 3's with their masks (``masks_of``: its config);
    anything else as it is."""
    import torch

    positions = batch.get("position_ids", torch.empty(0))
    if rope is not None and positions.ndim == 2:
        batch = {**batch, "position_ids": packed_positions(rope, batch)}
    if masks_of is not None and positions.ndim == 2:
        batch = {**batch, "attention_mask": packed_masks(masks_of, batch)}
    return batch


def has_packed_masks(config) -> bool:
    """A model whose packed rows take the masks ``packed_masks`` builds (Gemma 3: images attend both ways)."""
    return getattr(config, "model_type", None) == "gemma3"


def packed_masks(config, batch: dict) -> dict:
    """Gemma 3's attention masks for packed rows, by layer type (the mapping its forward takes as
    ``attention_mask``): inside each example (positions restart at 0), causal, and bidirectional among one image's
    tokens (``token_type_ids``); its sliding layers also within the window. transformers builds them itself from the
    position ids, but its sliding-layer mask reads the image blocks at each example's positions instead of the row's
    (masking_utils remaps every overlay of a packed row to positions), so a later example's image tokens attended to
    the wrong keys (4e-5 off the padded loss on the tiny model, 0.2 in logits); built here, packed = padded."""
    import torch

    positions, types = batch["position_ids"], batch["token_type_ids"]
    length = positions.shape[1]
    index = torch.arange(length, device=positions.device)
    example = (positions == 0).cumsum(-1)
    image = types == 1
    starts = image & ~torch.nn.functional.pad(image, (1, 0))[:, :-1]
    block = torch.where(image, starts.cumsum(-1) - 1, -1)
    causal = index[None, :, None] >= index[None, None, :]
    same_image = (block[:, :, None] == block[:, None, :]) & (block[:, :, None] >= 0)
    full = (causal | same_image) & (example[:, :, None] == example[:, None, :])
    window = getattr(config.get_text_config(), "sliding_window", None) or length
    sliding = full & (index[None, None, :] > index[None, :, None] - window)
    masks = {"full_attention": full[:, None], "sliding_attention": sliding[:, None]}
    if getattr(config, "_attn_implementation", "sdpa") == "eager":  # eager adds its mask to the scores
        masks = {k: torch.zeros(m.shape, device=m.device).masked_fill(~m, torch.finfo(torch.float32).min)
                 for k, m in masks.items()}
    return masks


def image_plan(config, max_pixels: int, max_length: int, tower_trains: bool, bytes_per_value: int = 2) -> dict:
    """What `plan` says of a vision-language job's images (#62), from the config alone (the parts counted on the meta
    device): an image at ``data.image_max_pixels`` (square) in patches and tokens of the sequence, how many such
    images ``max_length`` holds, and the tower's cost per image: forward FLOPs (2 x its parameters x patches, the
    attention over an image's patches added), and, when the tower trains, the activations its backward keeps
    (~16 values a patch per block per hidden unit: a rough count, said as such). A frozen tower keeps none: no
    gradient flows into it."""
    import math

    import torch
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    sizes = {part: sum(p.numel() for _, p in members) for part, members in parts(model).items()}
    vision = config.vision_config
    if config.model_type == "gemma3":
        side, patch, merge = vision.image_size, vision.patch_size, 1
        tokens = config.mm_tokens_per_image
    else:
        patch, merge = vision.patch_size, vision.spatial_merge_size
        unit = patch * merge
        side = max(unit, int(math.sqrt(max_pixels)) // unit * unit)
        tokens = (side // patch) ** 2 // merge ** 2
    patches = (side // patch) ** 2
    hidden = getattr(vision, "hidden_size", None) or vision.embed_dim
    depth = getattr(vision, "depth", None) or vision.num_hidden_layers
    tower = sizes["vision"] + sizes["projector"]
    flops = 2 * tower * patches + 4 * depth * patches * patches * hidden
    activations = 16 * depth * patches * hidden * bytes_per_value if tower_trains else 0
    return {"side": side, "patches": patches, "tokens": tokens, "per_sequence": max_length // max(tokens, 1),
            "tower_parameters": tower, "forward_flops": flops, "activation_bytes": activations}


def image_plan_line(facts: dict, max_pixels: int, trains: bool) -> str:
    """`plan`'s line for ``image_plan``'s facts."""
    kept = (f"~{facts['activation_bytes'] / 2**20:.0f} MiB of activations kept per image for its backward (a rough "
            f"count)" if trains else "no activations kept (frozen: no gradient flows into it)")
    return (f"images: one of up to {max_pixels:,} pixels ({facts['side']}x{facts['side']} square) is "
            f"{facts['patches']} patches and {facts['tokens']} tokens of the sequence ({facts['per_sequence']} such "
            f"images fill data.max_length); the tower and projector ({facts['tower_parameters'] / 1e6:.1f}M "
            f"parameters) compute {facts['forward_flops'] / 1e9:.1f} GFLOPs forward per image, {kept}")
