"""The files beside a model's config.json, and the fields of it that torch's own words do
not name, said for what they are (``memprobe step --config``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memprobe.errors import UserError
from memprobe.io.text import quoted
from memprobe.profile.hf_config import error_text, read_config_json

# Files a model folder holds beside config.json, told by their keys: handed to --config
# they were "has no model_type (a Hugging Face config.json names its model_type)", which
# says neither what the file is nor which one to give.
_OTHER_FILES = (
    (("do_sample", "max_new_tokens", "temperature", "top_p"), "its generation_config.json"),
    (("tokenizer_class", "chat_template", "model_max_length"), "its tokenizer_config.json"),
    (("added_tokens", "normalizer", "pre_tokenizer", "truncation"), "its tokenizer.json"),
    (("image_processor_type", "feature_extractor_type"), "its preprocessor_config.json"),
)


def no_model_type(file: Path, data: Mapping[str, Any]) -> UserError:
    """The line for a JSON object without a model_type: what the file is where its keys
    say (a PEFT adapter's config, a generation or tokenizer file), and what to give."""
    if "peft_type" in data or "base_model_name_or_path" in data:
        base, peft = data.get("base_model_name_or_path"), data.get("peft_type")
        kind = f"{quoted(peft)} " if isinstance(peft, str) and peft else ""
        of = f" on {quoted(base)}" if isinstance(base, str) and base else ""
        return UserError(
            f"--config {file} is a PEFT adapter's config ({kind}adapter{of}), not a model's",
            "give the base model's config.json; memprobe step trains every weight of it, "
            "adapters are not simulated",
        )
    for keys, what in _OTHER_FILES:
        if any(key in data for key in keys):
            return UserError(
                f"--config {file} reads as a model's {what.removeprefix('its ')}, not its "
                "config.json (it has no model_type)",
                "give the config.json from the same folder",
            )
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    named = data.get("architectures")
    by_class = {str(v): k for k, v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()}
    if isinstance(named, list):
        known = [by_class[n] for n in named if isinstance(n, str) and n in by_class]
        if known:
            return UserError(
                f"--config {file} has no model_type; its architectures name {quoted(named[0])}",
                f'add "model_type": "{known[0]}" to it',
            )
    return UserError(
        f"--config {file} has no model_type", "a Hugging Face config.json names its model_type"
    )


def no_config_json(source: Path) -> UserError:
    """A folder without config.json. A LoRA fine-tune's output folder (its
    adapter_config.json) was "no config.json in DIR": said to be a PEFT adapter's."""
    adapter = source / "adapter_config.json"
    if adapter.is_file():
        found = read_config_json(adapter)
        return no_model_type(adapter, found if isinstance(found, dict) else {"peft_type": 0})
    return UserError(
        f"--config: no config.json in {source}", "give a config.json or the directory holding it"
    )


def padding_error(config: Any, exc: BaseException) -> None:
    """nn.Embedding's "Padding_idx must be within num_embeddings" names neither field: a
    small config that gives no pad_token_id takes transformers' default (phi3's 32000)
    past its vocabulary. Raised as a line naming pad_token_id; else nothing."""
    pad = getattr(config, "pad_token_id", None)
    vocab = getattr(config, "vocab_size", None)
    if "Padding_idx" in str(exc) and isinstance(pad, int) and isinstance(vocab, int):
        raise UserError(
            f"transformers cannot build this model: pad_token_id {pad:,} (the config's, or "
            f"transformers' default for {config.model_type}) is not a token id of "
            f"vocab_size {vocab:,} ({error_text(exc)})",
            f"give a pad_token_id from 0 to {vocab - 1:,} in config.json",
        ) from None
