"""What a vision-language model's processor does to a conversation's images (#62), as the data step uses it: the
image processor (resize, normalise, patches) loaded from the model's directory, the placeholder its chat template
writes for an image, and the text each image becomes (one image token per merged patch for Qwen-VL, Gemma 3's
fixed ``\\n\\n<start_of_image>`` + N soft tokens + ``<end_of_image>\\n\\n``).

Written here, not by calling the model's ``AutoProcessor``, for two reasons: transformers 5's Qwen-VL processors
cannot be built without torchvision (their video processor is a required part; torchvision does not install beside
this project's CPU torch), and the data step needs each image's token count and where each replacement lands in
the text (to keep image spans whole under truncation and the labels on the replies). The replacement rules are the
processors' own (``Qwen2VLProcessor.replace_image_token``, ``Gemma3Processor.full_image_sequence``), and the tests
check the token ids against the processors themselves (tests/unit/test_vision_data.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scaletrain.errors import ConfigError

# A vision-language model's processor settings, beside its weights: what final/, merged/ and an export carry so that
# the model reads images at inference as it did in training (the chat template travels as the tokenizer's
# chat_template.jinja, the one the run trained with: never the base's chat_template.json beside it).
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
QWEN_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
GEMMA_TYPES = ("gemma3",)
QWEN_MARKS = ("<|vision_start|>", "<|vision_end|>")  # written around an image's tokens by Qwen-VL's template
GEMMA_TOKENS = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}


@dataclass(frozen=True)
class ImageProcessing:
    """What makes a model's image into its pixels and how many tokens that gives: the image processor (resize,
    normalise, patches) and its family's token rule. The data step sizes images with it (``sized``), the loaders'
    workers process them (``preprocess``, data/pixels.py)."""

    model_type: str
    image_processor: object
    tokens_per_image: int = 0  # Gemma 3: fixed; Qwen-VL: from each image's grid
    merge_size: int = 1

    @property
    def qwen(self) -> bool:
        return self.model_type in QWEN_TYPES

    def preprocess(self, images: list) -> dict:
        """The image processor's output for one row's images (numpy): ``pixel_values``, and ``image_grid_thw``
        (Qwen-VL), with each image's token count in ``tokens``."""
        import numpy as np

        out = dict(self.image_processor(images=images, return_tensors="np"))
        if self.qwen:
            grid = np.asarray(out["image_grid_thw"], dtype=np.int64)
            out["tokens"] = [int(g.prod()) // self.merge_size ** 2 for g in grid]
        else:
            out["tokens"] = [self.tokens_per_image] * len(images)
        return out

    def sized(self, width: int, height: int) -> tuple[int, tuple[int, ...]]:
        """(tokens, Qwen-VL's (t, h, w) grid, else ()) of an image already bounded to ``width`` x ``height``, from
        its size alone (#73: the data step never decodes pixels): the image processor's own resize rule
        (``smart_resize`` beside Qwen-VL's processor; Gemma 3's fixed count). The loaders' workers check the count
        again on the processed image."""
        if not self.qwen:
            return self.tokens_per_image, ()
        import sys

        p = self.image_processor
        size = p.size
        resize = sys.modules[type(p).__module__].smart_resize  # the module of every Qwen-VL image processor has it
        h, w = resize(height, width, p.patch_size * p.merge_size, min_pixels=size["shortest_edge"],
                      max_pixels=size["longest_edge"])
        grid = (1, h // p.patch_size, w // p.patch_size)
        return grid[1] * grid[2] // self.merge_size ** 2, grid


@dataclass(frozen=True)
class ImageText:
    """How a model's images enter its text: ``placeholder`` is what the chat template writes for an image part,
    ``image_token_id`` the id the model fills with image features, ``marks`` the ids written around each image's
    run (never cut from it); ``processing`` what its images become."""

    processing: ImageProcessing
    placeholder: str
    image_token: str
    image_token_id: int
    marks: tuple[int, ...]

    @property
    def model_type(self) -> str:
        return self.processing.model_type

    @property
    def qwen(self) -> bool:
        return self.processing.qwen

    def preprocess(self, images: list) -> dict:
        return self.processing.preprocess(images)

    def sized(self, width: int, height: int) -> tuple[int, tuple[int, ...]]:
        return self.processing.sized(width, height)

    def replacement(self, tokens: int) -> str:
        """The text an image of ``tokens`` tokens becomes in place of its placeholder (the processor's rule)."""
        if self.qwen:
            return self.image_token * tokens
        return f"\n\n{GEMMA_TOKENS['boi_token']}{self.image_token * tokens}{GEMMA_TOKENS['eoi_token']}\n\n"


def image_text(name_or_path: str, config, tokenizer) -> ImageText:
    """The ImageText of the vision-language model in ``name_or_path`` (its image processor read from the
    directory's preprocessor_config.json, never downloaded); a family scaletrain has no rule for is one line."""

    path = Path(name_or_path).expanduser()
    model_type = getattr(config, "model_type", "?")
    if model_type not in QWEN_TYPES + GEMMA_TYPES:
        raise ConfigError(f"model.name_or_path={name_or_path}: images for a {model_type} are not supported yet "
                          f"(supported: {', '.join(QWEN_TYPES + GEMMA_TYPES)}); give text-only data or one of those")
    if not (path / "preprocessor_config.json").is_file():
        raise ConfigError(f"model.name_or_path={name_or_path}: no preprocessor_config.json (the image processor's "
                          f"settings); copy it from the model's release beside config.json")
    processing = image_processing(str(path), config)
    vocab = tokenizer.get_vocab()
    if model_type in QWEN_TYPES:
        image_token = "<|image_pad|>"
        marks = tuple(vocab[m] for m in QWEN_MARKS if m in vocab)
        return ImageText(processing, image_token, image_token,
                         _id(config, "image_token_id", vocab, image_token, name_or_path), marks)
    marks = tuple(vocab[GEMMA_TOKENS[k]] for k in ("boi_token", "eoi_token") if GEMMA_TOKENS[k] in vocab)
    return ImageText(processing, GEMMA_TOKENS["boi_token"], GEMMA_TOKENS["image_token"],
                     _id(config, "image_token_index", vocab, GEMMA_TOKENS["image_token"], name_or_path), marks)


def image_processing(path: str, config) -> ImageProcessing:
    """The ImageProcessing of the vision-language model in ``path`` (its image processor read from the directory's
    preprocessor_config.json, never downloaded)."""
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(path, local_files_only=True)
    if config.model_type in QWEN_TYPES:
        return ImageProcessing(config.model_type, processor, merge_size=int(getattr(processor, "merge_size", 2)))
    per_image = int(getattr(config, "mm_tokens_per_image", 256))
    saved = _processor_config(Path(path)).get("image_seq_length")
    if saved is not None and int(saved) != per_image:
        raise ConfigError(f"model.name_or_path={path}: processor_config.json has image_seq_length={saved} and "
                          f"config.json mm_tokens_per_image={per_image}; they must agree (download the model again)")
    return ImageProcessing(config.model_type, processor, tokens_per_image=per_image)


def loader_pixels(name_or_path: str, config, max_pixels: int, min_pixels: int):
    """What the collator of a vision-language job reads and processes its images with (data/pixels.py Pixels)."""
    from scaletrain.data.pixels import Pixels
    from scaletrain.data.vision import type_column
    from scaletrain.model.files import model_dir

    token = config.image_token_index if config.model_type in GEMMA_TYPES else config.image_token_id
    return Pixels(image_processing(str(model_dir(name_or_path)), config).preprocess, max_pixels, min_pixels, token,
                  type_column(config.model_type))


def _processor_config(path: Path) -> dict:
    f = path / "processor_config.json"
    return json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}


def _id(config, key: str, vocab: dict, token: str, name: str) -> int:
    """The model's image token id, which must be the tokenizer's id of ``token``."""
    want = getattr(config, key, None)
    have = vocab.get(token)
    if have is None or (want is not None and want != have):
        raise ConfigError(f"model.name_or_path={name}: the tokenizer's {token} is id {have} and config.json's {key} "
                          f"is {want}; the tokenizer does not belong to this model (copy the model's own tokenizer "
                          f"files)")
    return have


def image_text_factory(name_or_path: str, tokenizer):
    """For a vision-language model's directory, what builds its ImageText when the data has images (the data step
    calls it then: text-only data needs no image processor); None for a text model."""
    import functools

    from scaletrain.model.files import model_dir
    from scaletrain.model.vision import is_vision_language

    path = model_dir(name_or_path)
    if path is None:
        return None
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    if not is_vision_language(config):
        return None
    return functools.cache(functools.partial(image_text, str(path), config, tokenizer))


def copy_processor_files(name_or_path: str, *targets) -> list[str]:
    """The model directory's processor files copied into each of ``targets``; their names."""
    import shutil

    from scaletrain.model.files import model_dir

    source = model_dir(name_or_path)
    names = [n for n in PROCESSOR_FILES if source is not None and (source / n).is_file()]
    for target in targets:
        for n in names:
            shutil.copyfile(source / n, Path(target) / n)
    return names
