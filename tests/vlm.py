"""Tiny image-text-to-text models built from transformers' configs (random init, never downloaded) for the vision
tests (#62): Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Gemma 3, each saved with a processor made here: tiny-llama's
tokenizer with the family's special tokens, the family's real chat template (tests/fixtures/chat_templates) and its
image processor (the PIL one: no torchvision here) at a small size; and small synthetic images (Pillow)."""

from pathlib import Path

TEXT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
QWEN_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
GEMMA_TOKENS = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}
GEMMA_TURNS = ["<start_of_turn>", "<end_of_turn>"]
GEMMA_IMAGE_TOKENS = 4  # soft tokens per image (mm_tokens_per_image)


def tiny_config(kind: str, vocab: int, ids: dict | None = None):
    """A config of ``kind`` (qwen2_vl, qwen2_5_vl, qwen3_vl, gemma3) with a ``vocab``-token text model; the image
    token ids are ``ids`` (the tokenizer's), else the vocabulary's last ids."""
    from transformers import Gemma3Config, Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig

    ids = ids or dict(image_token_id=vocab - 1, video_token_id=vocab - 2, vision_start_token_id=vocab - 3,
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
                                           num_attention_heads=2, image_size=64, patch_size=16,
                                           vision_use_head=False),  # as Gemma 3 is released: no pooling head
                        mm_tokens_per_image=GEMMA_IMAGE_TOKENS,
                        image_token_index=ids.get("image_token_index", vocab - 1),
                        boi_token_index=ids.get("boi_token_index", vocab - 2),
                        eoi_token_index=ids.get("eoi_token_index", vocab - 3))


def tiny_tokenizer(kind: str, scratch: Path):
    """tiny-llama's tokenizer with the family's special tokens and real chat template."""
    from transformers import AutoTokenizer

    from scaletrain.model.files import TINY_LLAMA
    from scaletrain.model.tokenizer import load_tokenizer

    tok = load_tokenizer(TINY_LLAMA)
    gemma = kind == "gemma3"
    tok.add_special_tokens({"additional_special_tokens": GEMMA_TURNS + list(GEMMA_TOKENS.values()) if gemma
                            else QWEN_TOKENS})
    tok.chat_template = (TEMPLATES / ("gemma3_it.jinja" if gemma else "qwen2_vl_instruct.jinja")).read_text()
    if not gemma:
        return tok
    tok.save_pretrained(scratch)  # Gemma's processor reads boi/image/eoi tokens as the tokenizer's named tokens
    return AutoTokenizer.from_pretrained(str(scratch), extra_special_tokens=GEMMA_TOKENS)


def image_processor(kind: str):
    """The family's image processor (PIL) at a tiny size: Qwen-VL images of 56x56 to 112x112 pixels, Gemma's 64x64."""
    from transformers import Gemma3ImageProcessorPil, Qwen2VLImageProcessorPil

    if kind == "gemma3":
        return Gemma3ImageProcessorPil(size={"height": 64, "width": 64})
    patch = 16 if kind == "qwen3_vl" else 14
    return Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                    size={"shortest_edge": (2 * patch) ** 2, "longest_edge": (8 * patch) ** 2})


def reference_processor(kind: str, tok):
    """The family's own transformers processor around the same parts (the reference the data step must equal).
    Qwen-VL's wants a video processor, which needs torchvision: built here without one (images only)."""
    from transformers import Gemma3Processor, Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor, processing_utils

    if kind == "gemma3":
        return Gemma3Processor(image_processor=image_processor(kind), tokenizer=tok, chat_template=tok.chat_template,
                               image_seq_length=GEMMA_IMAGE_TOKENS)
    cls = {"qwen2_vl": Qwen2VLProcessor, "qwen2_5_vl": Qwen2_5_VLProcessor, "qwen3_vl": Qwen3VLProcessor}[kind]
    check = processing_utils.ProcessorMixin.check_argument_for_proper_class
    processing_utils.ProcessorMixin.check_argument_for_proper_class = lambda self, name, arg: None
    try:
        return cls(image_processor=image_processor(kind), tokenizer=tok, video_processor=None,
                   chat_template=tok.chat_template)
    finally:
        processing_utils.ProcessorMixin.check_argument_for_proper_class = check


def save_tiny(kind: str, out: Path) -> Path:
    """The model of ``kind`` saved in ``out`` in bf16 (as Qwen-VL and Gemma 3 are released) with its tokenizer,
    chat template and image processor."""
    import json

    import torch
    from transformers import AutoModelForImageTextToText

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = tiny_tokenizer(kind, out)
    vocab = tok.get_vocab()
    if kind == "gemma3":
        ids = {"image_token_index": vocab["<image_soft_token>"], "boi_token_index": vocab["<start_of_image>"],
               "eoi_token_index": vocab["<end_of_image>"]}
    else:
        ids = {"image_token_id": vocab["<|image_pad|>"], "video_token_id": vocab["<|video_pad|>"],
               "vision_start_token_id": vocab["<|vision_start|>"], "vision_end_token_id": vocab["<|vision_end|>"]}
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(tiny_config(kind, len(tok), ids))
    model.to(torch.bfloat16).save_pretrained(out)  # as the real ones are released: bf16 (config.json says so)
    tok.save_pretrained(out)
    image_processor(kind).save_pretrained(out)
    if kind == "gemma3":
        (out / "processor_config.json").write_text(json.dumps({"processor_class": "Gemma3Processor",
                                                               "image_seq_length": GEMMA_IMAGE_TOKENS}))
    return out


def collator(path: Path, tok, stand_in=None, max_pixels: int = 768 * 768, min_pixels: int = 32 * 32):
    """The collator a run of the model in ``path`` builds: its images read and processed per batch (data/pixels.py)
    with the data step's bounds (data.image_max_pixels / image_min_pixels, defaults here)."""
    from transformers import AutoConfig

    from scaletrain.data import Collator
    from scaletrain.model.processor import loader_pixels

    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    return Collator(tok.pad_token_id or 0, stand_in, loader_pixels(str(path), config, max_pixels, min_pixels))


def image(width: int, height: int, seed: int = 0):
    """A small RGB image of random pixels."""
    import numpy as np
    from PIL import Image

    return Image.fromarray((np.random.default_rng(seed).random((height, width, 3)) * 255).astype("uint8"))


MLLM_INFO = {"mllm_demo": {"file_name": "mllm_demo.json", "formatting": "sharegpt",
                           "columns": {"messages": "messages", "images": "images"},
                           "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                    "assistant_tag": "assistant"}}}
QUESTIONS = ["Who are they?", "What is in the picture?", "Describe it briefly.", "How many are there?"]
ANSWERS = ["They are two friends.", "A red ball on grass.", "A small dog sleeps.", "There are three cats."]


def mllm_demo(out: Path, n: int = 8, text_only_every: int = 4) -> Path:
    """LLaMA-Factory's ``mllm_demo`` shape in ``out``: mllm_demo.json (``messages`` with ``<image>`` placeholders,
    an ``images`` column of paths relative to it), its JPEGs in mllm_demo_data/, and dataset_info.json. Row k has
    1 image, 2 when k % 3 == 2, and none when k % ``text_only_every`` is its last value."""
    import json

    out = Path(out)
    (out / "mllm_demo_data").mkdir(parents=True, exist_ok=True)
    rows = []
    for k in range(n):
        count = 0 if k % text_only_every == text_only_every - 1 else (2 if k % 3 == 2 else 1)
        names = [f"mllm_demo_data/{k}_{j}.jpg" for j in range(count)]
        for j, name in enumerate(names):
            image(40 + 12 * ((k + j) % 5), 30 + 10 * ((k * 3 + j) % 4), seed=k * 10 + j).save(out / name)
        rows.append({"messages": [{"role": "user", "content": "<image>" * count + QUESTIONS[k % 4]},
                                  {"role": "assistant", "content": ANSWERS[k % 4]}], "images": names})
    (out / "mllm_demo.json").write_text(json.dumps(rows, indent=1))
    (out / "dataset_info.json").write_text(json.dumps(MLLM_INFO, indent=1))
    return out


def llamafactory_data(out: Path, n: int = 8) -> Path:
    """``mllm_demo`` (mllm_demo()) with LLaMA-Factory's two text sets its VL examples mix in: identity and
    alpaca_en_demo (alpaca records, no images), each with its dataset_info.json entry."""
    import json

    out = mllm_demo(out, n)
    for name in ("identity", "alpaca_en_demo"):
        rows = [{"instruction": f"{QUESTIONS[k % 4]} ({name} {k})", "input": "", "output": ANSWERS[k % 4]}
                for k in range(n // 2)]
        (out / f"{name}.json").write_text(json.dumps(rows))
    info = json.loads((out / "dataset_info.json").read_text())
    info.update({name: {"file_name": f"{name}.json"} for name in ("identity", "alpaca_en_demo")})
    (out / "dataset_info.json").write_text(json.dumps(info, indent=1))
    return out


RLHF_V_INFO = {"rlhf_v": {"file_name": "rlhf_v.json", "ranking": True, "formatting": "sharegpt",
                          "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected",
                                      "images": "images"}}}


def rlhf_v(out: Path, n: int = 8) -> Path:
    """LLaMA-Factory's ``rlhf_v`` shape (a DPO set with images) in ``out``: sharegpt ``conversations`` whose human
    turn holds ``<image>``, ``chosen`` and ``rejected`` gpt turns, an ``images`` column; with dataset_info.json."""
    import json

    out = Path(out)
    (out / "rlhf_v_data").mkdir(parents=True, exist_ok=True)
    rows = []
    for k in range(n):
        name = f"rlhf_v_data/{k}.jpg"
        image(48 + 8 * (k % 3), 40 + 6 * (k % 4), seed=100 + k).save(out / name)
        rows.append({"conversations": [{"from": "human", "value": "<image>" + QUESTIONS[k % 4]}],
                     "chosen": {"from": "gpt", "value": ANSWERS[k % 4]},
                     "rejected": {"from": "gpt", "value": ANSWERS[(k + 1) % 4]}, "images": [name]})
    (out / "rlhf_v.json").write_text(json.dumps(rows, indent=1))
    info = json.loads((out / "dataset_info.json").read_text()) if (out / "dataset_info.json").is_file() else {}
    (out / "dataset_info.json").write_text(json.dumps({**info, **RLHF_V_INFO}, indent=1))
    return out
