"""Which encoder a source gets (classification, text, chat, preference pairs, KTO) and the column checks that
come with it: records of another shape than the config says (alpaca given sharegpt, pairs given stage sft, a KTO
file without tags) are one line naming the file and the key to set, before anything is tokenized."""

from __future__ import annotations

from functools import partial

from scaletrain.config.schema import Config
from scaletrain.config.stages import PAIR_STAGES, RL_STAGES
from scaletrain.data import encode
from scaletrain.data.images import media_base
from scaletrain.data.labels import Labels
from scaletrain.data.pairs import V1_SIDES, encode_kto, encode_pairs
from scaletrain.data.sources import Source, require_columns
from scaletrain.data.templates import supports_tools
from scaletrain.data.tools import load_tools
from scaletrain.errors import DataError

# config key -> the Columns field a dataset_info.json entry's "columns" maps
_ENTRY_FIELD = {"instruction_column": "prompt", "output_column": "response", "text_column": "text",
                "messages_column": "messages"}


def _lf_mapped(mapped: set[str]) -> set[str]:
    return {key for key, f in _ENTRY_FIELD.items() if f in mapped}


def encoder_for(ds, src: Source, cfg: Config, tokenizer, template: tuple[str, str], labels: Labels | None,
                image_text=None):
    """The batched ``datasets.map`` function that encodes this source for the job's task and stage, after checking
    that the records have the columns it reads (one line naming the file and the fix when they do not).
    ``image_text``: a vision-language model's (model/processor.py), for records with images."""
    d, c = cfg.data, src.columns
    if d.reasoning == "drop" and (image_text is not None or cfg.train.stage != "sft"):
        raise DataError(f"{src.key}={src.path}: data.reasoning: drop applies to supervised chat data without images "
                        f"so far, not train.stage={cfg.train.stage}{' with images' if image_text else ''}; remove "
                        f"data.reasoning (its reasoning then trains as the chat template writes it)")
    if image_text is not None:  # the job's data has images (a source without them joins them: no images each)
        return _vision_encoder(ds, src, cfg, tokenizer, template, image_text)
    if cfg.model.task == "sequence-classification":
        cols = {"text_column": d.text_column, "label_column": d.label_column}
        if d.text_pair_column:
            cols["text_pair_column"] = d.text_pair_column
        chatty = {"instruction", "conversations", "messages", "output"} & set(ds.column_names)
        hint = (f" (the file looks like causal-LM data, with '{sorted(chatty)[0]}': set model.task=causal-lm)"
                if chatty and d.text_column not in ds.column_names else "")
        require_columns(ds, cols, src.key, src.path, hint)
        if not labels.names:
            _check_label_range(ds, labels.num_labels, d.label_column, src)
        return partial(encode.encode_classification, tokenizer=tokenizer, text=d.text_column,
                       pair=d.text_pair_column, label=d.label_column, max_length=d.max_length,
                       regression=labels.num_labels == 1, label2id=labels.label2id)
    if src.formatting == "alpaca" and c.prompt not in ds.column_names and (
            {c.messages, "conversations", "messages"} & set(ds.column_names)):
        raise DataError(f"{src.key}={src.path}: the records hold conversations, not alpaca columns; set "
                        f"data.formatting=sharegpt (or messages, for role/content turns)")
    if src.formatting in ("sharegpt", "messages") and {c.prompt, c.response} <= set(ds.column_names) and (
            c.messages not in ds.column_names):
        raise DataError(f"{src.key}={src.path}: the records are alpaca ({c.prompt}/{c.query}/{c.response} columns), "
                        f"not {src.formatting} turns; set data.formatting=alpaca"
                        + (f" (or the entry's \"formatting\" in {src.extra['info']})" if src.extra else ""))
    if cfg.train.stage in RL_STAGES:  # prompts: TRL's prompt column, or a conversation before its last reply
        from scaletrain.data.prompts import encode_prompts

        if cfg.rl.prompt_column not in ds.column_names:
            require_columns(ds, c.required(src.formatting), src.key, src.path,
                            f" (or a '{cfg.rl.prompt_column}' column: TRL's prompt-only format, rl.prompt_column)")
        elif cfg.train.stage == "grpo" and "accuracy" in cfg.rl.reward_funcs and (
                cfg.rl.answer_column not in ds.column_names):  # distill: no reward
            raise DataError(f"{src.key}={src.path}: rl.reward_funcs has accuracy, which checks each completion "
                            f"against the '{cfg.rl.answer_column}' column, and the records have none (columns: "
                            f"{', '.join(sorted(ds.column_names))}); set rl.answer_column to the answer's column")
        declared = load_tools(cfg.rl)
        if declared is not None and not supports_tools(template[1]):
            raise DataError(f"rl.tools / rl.environment declare tools and the chat template ({template[0]}) has no "
                            f"tool format; set data.template to the model's own (or a built-in that writes tools: "
                            f"qwen, qwen3, llama3.1, mistral)")
        return partial(encode_prompts, tokenizer=tokenizer, formatting=src.formatting, columns=c,
                       template=template[1], prompt_column=cfg.rl.prompt_column, answer_column=cfg.rl.answer_column,
                       max_length=d.max_length, enable_thinking=d.enable_thinking,
                       tools=declared.schemas if declared else None)
    preference = cfg.train.stage in PAIR_STAGES
    required = c.required(src.formatting)
    if cfg.train.stage == "kto":
        if src.formatting == "text":
            raise DataError(f"{src.key}={src.path}: train.stage=kto trains on tagged replies, not text; give a KTO "
                            f"dataset (a conversation and a '{c.kto_tag}' true/false column)")
        required.update({"kto_tag_column": c.kto_tag})
        info = src.extra.get("info") if src.extra and "kto_tag" in src.extra["mapped"] else None
        require_columns(ds, required, src.key, src.path, info=info)
        return partial(encode_kto, tokenizer=tokenizer, formatting=src.formatting, columns=c, template=template[1],
                       max_length=d.max_length)
    if preference:
        if src.formatting == "text":
            raise DataError(f"{src.key}={src.path}: train.stage=dpo trains on chosen/rejected pairs, not text; "
                            f"give a preference dataset (alpaca, sharegpt or messages with chosen/rejected)")
        required = {k: v for k, v in required.items() if k != "output_column"}
        required.update({"chosen_column": c.chosen, "rejected_column": c.rejected})
        if src.formatting == "messages" and set(V1_SIDES) <= set(ds.column_names):  # v1's: two whole conversations
            required = dict(zip(("chosen_column", "rejected_column"), V1_SIDES))
        elif src.formatting == "messages" and c.messages not in ds.column_names:  # orca_dpo_pairs: whole sides
            required.pop("messages_column", None)
    elif {c.chosen, c.rejected} <= set(ds.column_names) and c.response not in ds.column_names:
        raise DataError(f"{src.key}={src.path}: the records are preference pairs ('{c.chosen}'/'{c.rejected}' "
                        f"columns); set train.stage=dpo to train on them (or give SFT data)")
    info = src.extra.get("info") if src.extra and set(required) & _lf_mapped(src.extra["mapped"]) else None
    require_columns(ds, required, src.key, src.path, info=info)
    if preference:
        return partial(encode_pairs, tokenizer=tokenizer, formatting=src.formatting, columns=c,
                       template=template[1], max_length=d.max_length)
    if src.formatting == "text":
        return partial(encode.encode_text, tokenizer=tokenizer, column=c.text, max_length=d.max_length)
    return partial(encode.encode_chat, tokenizer=tokenizer, formatting=src.formatting, columns=c,
                   template=template[1], template_name=template[0], max_length=d.max_length,
                   mask_history=d.multi_turn == "last", train_on_prompt=d.train_on_prompt,
                   enable_thinking=d.enable_thinking, per_turn=d.multi_turn == "per_turn",
                   drop_reasoning=d.reasoning == "drop")


def _vision_encoder(ds, src: Source, cfg: Config, tokenizer, template: tuple[str, str], image_text):
    """Records with images (data/vision.py): supervised fine-tuning of a chat, its images beside the text."""
    from scaletrain.data.vision import encode_vision_chat, encode_vision_pairs

    d, c = cfg.data, src.columns
    if cfg.train.stage not in ("sft", "dpo") or src.formatting == "text":
        what = f"train.stage={cfg.train.stage}" if cfg.train.stage not in ("sft", "dpo") else "data.formatting=text"
        raise DataError(f"{src.key}={src.path}: records with images train with train.stage=sft or dpo on "
                        f"conversations (sharegpt, messages or alpaca) so far, not {what}; give text-only data for "
                        f"{what}")
    if d.template != "auto":
        raise DataError(f"{src.key}={src.path}: records with images are rendered by the model's own chat template "
                        f"(it writes each image part as the model was trained), not data.template={d.template}; set "
                        f"data.template: auto")
    if d.multi_turn == "per_turn":
        raise DataError(f"{src.key}={src.path}: data.multi_turn=per_turn with images is not supported (each turn "
                        f"would carry every image again); use multi_turn: spans or last")
    info = src.extra.get("info") if src.extra and set(c.required(src.formatting)) & _lf_mapped(
        src.extra["mapped"]) else None
    media = media_base(d.media_dir, src.path)
    if cfg.train.stage == "dpo":  # LLaMA-Factory's rlhf_v shape: a prompt with images, chosen and rejected replies
        required = {k: v for k, v in c.required(src.formatting).items() if k != "output_column"}
        required.update({"chosen_column": c.chosen, "rejected_column": c.rejected})
        require_columns(ds, required, src.key, src.path, info=info, images=c.images)
        return partial(encode_vision_pairs, tokenizer=tokenizer, image_text=image_text, formatting=src.formatting,
                       columns=c, template=template[1], max_length=d.max_length, media_dir=media,
                       max_pixels=d.image_max_pixels, min_pixels=d.image_min_pixels)
    require_columns(ds, c.required(src.formatting), src.key, src.path, info=info, images=c.images)
    return partial(encode_vision_chat, tokenizer=tokenizer, image_text=image_text, formatting=src.formatting,
                   columns=c, template=template[1], max_length=d.max_length, mask_history=d.multi_turn == "last",
                   train_on_prompt=d.train_on_prompt, media_dir=media, max_pixels=d.image_max_pixels,
                   min_pixels=d.image_min_pixels, enable_thinking=d.enable_thinking)


def _check_label_range(ds, num_labels: int, column: str, src: Source) -> None:
    if num_labels == 1:
        return
    for i, label in enumerate(ds[column]):  # bad labels are skipped and counted in the map
        if not encode._label_problem(label, regression=False) and not 0 <= label < num_labels:
            raise DataError(f"{src.key}={src.path}: label {int(label)} (record {i + 1}) is outside [0, "
                            f"{num_labels}); set model.num_labels to the number of classes")
