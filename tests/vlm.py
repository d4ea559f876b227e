"""Tiny image-text-to-text models built from transformers' configs (random init, never downloaded) for the vision
tests (#62): Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Gemma 3, saved with tiny-llama's tokenizer and chat template."""

from pathlib import Path

TEXT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)


def tiny_config(kind: str, vocab: int):
    """A config of ``kind`` (qwen2_vl, qwen2_5_vl, qwen3_vl, gemma3) with a ``vocab``-token text model; the image
    token ids are the vocabulary's last ids."""
    from transformers import Gemma3Config, Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig

    ids = dict(image_token_id=vocab - 1, video_token_id=vocab - 2, vision_start_token_id=vocab - 3,
               vision_end_token_id=vocab - 4)
    if kind in ("qwen2_vl", "qwen2_5_vl"):
        cls = Qwen2VLConfig if kind == "qwen2_vl" else Qwen2_5_VLConfig
        rope = {"type": "mrope", "mrope_section": [2, 3, 3]}
        return cls(text_config=dict(vocab_size=vocab, **TEXT, rope_scaling=rope),
                   vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, in_chans=3,
                                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                                      intermediate_size=64),
                   **ids)
    if kind == "qwen3_vl":
        rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}
        return Qwen3VLConfig(
            text_config=dict(vocab_size=vocab, **TEXT, head_dim=16, rope_scaling=rope),
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=16,
                               spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                               num_position_embeddings=64, deepstack_visual_indexes=[0]),
            **ids)
    return Gemma3Config(text_config=dict(vocab_size=vocab, **TEXT, head_dim=16),
                        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=64, patch_size=16),
                        mm_tokens_per_image=4, image_token_index=vocab - 1)


def save_tiny(kind: str, out: Path) -> Path:
    """The model of ``kind`` saved in ``out`` with tiny-llama's tokenizer (its chat template)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from scaletrain.model.files import TINY_LLAMA
    from scaletrain.model.tokenizer import load_tokenizer

    tok = load_tokenizer(TINY_LLAMA)
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(tiny_config(kind, len(tok))).save_pretrained(out)
    tok.save_pretrained(out)
    return out
