"""A ``config.json`` checked before transformers sees it: read as a bounded regular file,
numbers JSON allows and a machine can hold, and the sizes a step is built from present,
whole and within reach.

transformers fills a missing size from its own defaults (a Llama config without
``hidden_size`` became a 4096-wide model without a word), raises its own validation
errors for a wrong type, and builds a model of a billion layers if told to. A step
planned on any of those is not the user's model, so each is one line here instead.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from memprobe.errors import UserError
from memprobe.io.codec import nests_past
from memprobe.io.files import read_regular
from memprobe.io.text import (
    DuplicateKey,
    binary_kind,
    exception_text,
    json_error,
    printable,
    quoted,
    shortened,
    unique_keys,
    utf8_text,
)

# A config.json is a few KiB; this leaves room for inlined maps, not for a data file.
MAX_CONFIG_BYTES = 16 << 20
# Any count memprobe takes stops at 2^40 (tokens, batch, vocabulary...).
MAX_SIZE = 2**40
# The deepest public models have under 200 layers; a step builds every one of them.
MAX_LAYERS = 1024
# Digits of the largest integer a config may hold (int64: 19).
_MAX_DIGITS = 19
# How deep a config.json may nest objects and lists: a real one nests a few (a
# quantization_config's groups, 5), as run.json's bound.
MAX_CONFIG_DEPTH = 64
# The sizes a step is built from, under transformers' standard names (a config may use
# its architecture's own, e.g. GPT-2's n_embd: the config class's attribute_map says).
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# Sizes checked when the config gives them (None means "as the attention heads").
OPTIONAL = ("intermediate_size", "num_key_value_heads", "head_dim")
# A classifier head's labels: thousands at most (ImageNet-21k's 21,841). transformers makes
# a name for each as the config loads (about 100 bytes apiece), 2^20 of them ~100 MiB.
MAX_LABELS = 2**20


# A Hugging Face Hub model id, ``owner/name``: what a newcomer types for --config.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def _refuse_a_hub_id(file: Path) -> None:
    """``--config meta-llama/Llama-3.2-1B``, not a path here, is a Hub model id: memprobe
    downloads nothing, and "does not exist (check the path)" left the user checking a
    path they never meant. Say where the config.json comes from instead."""
    text = str(file)
    if file.exists() or file.is_symlink() or text.endswith(".json") or file.parent.exists():
        return  # a path, mistyped (tiny/nosuch beside a folder tiny): "check the path" holds
    if _HUB_ID.fullmatch(text):
        raise UserError(
            f"--config {text} is not a file or directory here; it reads like a Hugging Face "
            "Hub model id, and memprobe downloads nothing",
            f"save that model's config.json (https://huggingface.co/{text}/blob/main/"
            "config.json) and give its path, e.g. --config config.json",
        )


def read_config_json(file: Path) -> Any:
    """The parsed JSON of ``file``: a regular file under the cap, integers of at most 19
    digits, no NaN or Infinity (which JSON does not have), nesting Python can parse."""
    _refuse_a_hub_id(file)
    raw = read_regular(file, what="--config", max_bytes=MAX_CONFIG_BYTES)

    def whole(text: str) -> int:
        if len(text.lstrip("-")) > _MAX_DIGITS:
            raise UserError(
                f"--config {file} holds an integer of {len(text.lstrip('-')):,} digits",
                "a model's config.json holds sizes, not numbers beyond 64 bits",
            )
        return int(text)

    def constant(name: str) -> float:
        raise UserError(
            f"--config {file} holds {name}, which JSON does not allow", "fix config.json"
        )

    def decimal(text: str) -> float:
        # A number past a float's range (1e400) reads as infinity: the Infinity refused
        # above, spelled another way (a rope_theta of inf built the model without a word).
        value = float(text)
        if not math.isfinite(value):
            raise UserError(
                f"--config {file} holds {shortened(text)}, past a float's range (read as infinity)",
                "fix config.json",
            )
        return value

    try:
        parsed = json.loads(
            utf8_text(raw),
            parse_int=whole,
            parse_float=decimal,
            parse_constant=constant,
            object_pairs_hook=unique_keys,
        )
    except DuplicateKey as exc:
        raise UserError(
            f"--config {file} {exc} (JSON would keep the last without a word)",
            "keep the one you mean and fix config.json",
        ) from None
    except RecursionError:
        raise UserError(
            f"--config {file} nests too deep to read", "give a model's config.json"
        ) from None
    except UnicodeDecodeError as exc:
        kind = binary_kind(raw)
        if kind:
            raise UserError(
                f"--config {file} is {kind}, not a config.json", "give a model's config.json"
            ) from None
        raise UserError(
            f"--config {file} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset "
            f"{exc.start:,})",
            "JSON is UTF-8: save config.json as UTF-8",
        ) from None
    except json.JSONDecodeError as exc:
        raise UserError(
            f"--config {file} is not readable JSON ({json_error(exc)})",
            "give a model's config.json",
        ) from None
    if nests_past(parsed, MAX_CONFIG_DEPTH):
        # JSON parses a few hundred levels; transformers copies the config recursively
        # while the step is traced, so 500 levels of rope_scaling failed "on meta in its
        # setup phase" with a RecursionError blamed on the step's own recursion limit.
        raise UserError(
            f"--config {file} nests deeper than {MAX_CONFIG_DEPTH} levels; a model's "
            "config.json nests a few",
            "fix config.json",
        )
    return parsed


def check_text_only(
    model_type: str, config_class: Any, fields: dict[str, Any], causal_lms: Mapping[str, Any]
) -> None:
    """A text model's config: its sizes at the top level, where the step reads them.

    A multimodal architecture (gemma3, mllama) reads its text model's sizes from its
    ``text_config`` and nothing else: sizes written at the top level were passed over
    and its defaults built a 2.72B-parameter model for a 100K-parameter config, without
    a word; sizes nested where they belong failed the step "on meta" (its config has no
    ``vocab_size``). A ``text_config`` given to an architecture that takes none (llama)
    failed as a dict with no ``to_dict``, with a hint blaming meta."""
    subs = getattr(config_class, "sub_configs", None) or {}
    kind = printable(model_type)
    if "text_config" in subs:
        text_type = getattr(subs["text_config"], "model_type", "")
        hint = (
            f"give its text model's config: text_config's fields, with model_type \"{text_type}\""
            if text_type in causal_lms
            else "give the config of a text-only causal LM (llama, qwen2, mistral, ...)"
        )
        raise UserError(
            f"the {kind} config is a multimodal model's, whose text model's sizes are "
            "read from its text_config: memprobe step builds text-only causal LMs",
            hint,
        )
    if fields.get("text_config") is not None:
        raise UserError(
            f"the {kind} config gives a text_config, which {kind} does not take "
            "(its sizes are read from the top level)",
            "move the sizes to the top level of config.json and drop text_config",
        )


def has_attention_heads(config_class: Any) -> bool:
    """Whether the architecture's config declares attention heads: an attention-free one
    (mamba, mamba2, rwkv, xlstm) has none, and its config.json gives none."""
    aliases = getattr(config_class, "attribute_map", None) or {}
    declared = (getattr(c, "__annotations__", {}) for c in getattr(config_class, "__mro__", ()))
    return "num_attention_heads" in aliases or any("num_attention_heads" in d for d in declared)


def check_sizes(
    model_type: str, fields: dict[str, Any], aliases: dict[str, str], *, heads: bool = True
) -> None:
    """Every size in :data:`REQUIRED` present (a multimodal config, which nests them in
    ``text_config``, is refused before: :func:`check_text_only`; an attention-free one,
    ``heads`` false, has no attention heads to give) and each size given a whole number
    within reach, and ``num_labels`` no more than a classifier names (a causal LM reads
    none, but transformers names each as the config loads: num_labels 10^9 in a 200-byte
    file filled every byte of memory, then read "the llama config does not load ()")."""
    labels = fields.get("num_labels")
    if isinstance(labels, int) and not isinstance(labels, bool) and labels > MAX_LABELS:
        raise UserError(
            f"the {printable(model_type)} config's num_labels is {labels:,}: a classifier's "
            f"labels, at most {MAX_LABELS:,} (transformers names each one as it loads)",
            "drop num_labels from config.json (a causal LM's head is over its vocab_size)",
        )
    for name, alias in aliases.items():
        # Every name the config class maps, not the sizes checked below alone: Mixtral's
        # num_experts is its num_local_experts, and given 64 beside 4, transformers built
        # 64 experts a layer without a word (3.24M parameters for a model of 0.3M).
        if name in fields and alias in fields and fields[name] != fields[alias]:
            _two_names(model_type, fields, name, alias)
    for name in REQUIRED + OPTIONAL:
        alias = aliases.get(name, name)
        required = name in REQUIRED and (heads or name != "num_attention_heads")
        layers, why = name == "num_hidden_layers", ""
        if "encoder_" in alias:
            # An encoder-decoder (bart, marian, whisper) maps the standard name to its
            # encoder, but its causal LM is its decoder, built from decoder_* sizes: a
            # config of num_hidden_layers 2 built transformers' default 12-layer decoder.
            why = f" (its causal LM is its decoder; {name} is its {alias})"
            name = alias = alias.replace("encoder_", "decoder_")
        if alias != name and name in fields and alias in fields and fields[name] != fields[alias]:
            # GPT-2's n_embd is its hidden_size: given both, transformers builds one of
            # them without a word (n_embd 64 and hidden_size 4096 built 405M parameters).
            _two_names(model_type, fields, name, alias)
        key = name if name in fields else alias
        if key not in fields:
            if required:
                raise UserError(
                    f"the {printable(model_type)} config gives no {key}{why}",
                    "a model's config.json gives its sizes; memprobe does not fill them "
                    "from transformers' defaults",
                )
            continue
        value = fields[key]
        if value is None and not required:
            continue
        top = MAX_LAYERS if layers else MAX_SIZE
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise UserError(
                f"the {printable(model_type)} config's {key} is {quoted(value)}: "
                f"a whole number from 1 to {top:,} is needed",
                "fix config.json",
            )


def _two_names(model_type: str, fields: dict[str, Any], name: str, alias: str) -> NoReturn:
    raise UserError(
        f"the {printable(model_type)} config gives {alias} {quoted(fields[alias])} and "
        f"{name} {quoted(fields[name])}: two names for one size",
        "give one of them in config.json",
    )


# Expert counts under the names MoE configs give them, beside num_experts_per_tok.
_EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts")


def check_ratios(model_type: str, fields: dict[str, Any], aliases: dict[str, str]) -> None:
    """Sizes that must fit each other: the key/value heads a divisor of the attention heads,
    an MoE's experts per token no more than its experts. Left to the step, either ended in
    a failed tensor op on meta, with a hint that blamed meta for it."""

    def given(name: str) -> tuple[str, int | None]:
        key = name if name in fields else aliases.get(name, name)
        value = fields.get(key)
        return key, value if isinstance(value, int) and not isinstance(value, bool) else None

    kind = printable(model_type)
    heads_key, heads = given("num_attention_heads")
    kv_key, kv = given("num_key_value_heads")
    if heads and kv and heads % kv:
        raise UserError(
            f"the {kind} config's {kv_key} ({kv:,}) does not divide its {heads_key} ({heads:,})",
            "each key/value head serves the same number of query heads; fix config.json",
        )
    per_key, per = given("num_experts_per_tok")
    for total_key in _EXPERT_COUNTS:
        _, total = given(total_key)
        # 0 experts is given too (a dense model gives none): top-k of 0 failed on meta.
        if per is not None and total is not None and per > total:
            raise UserError(
                f"the {kind} config's {per_key} is {per:,} with {total_key} {total:,}: "
                "each token is routed to at most that many experts",
                "fix config.json",
            )


# What a size is called: a count (num_*, n_*) or a width (*_size, *_dim, *_rank, ...).
# Beside the sizes checked by name (REQUIRED, OPTIONAL), each architecture has its own
# (kv_lora_rank, moe_intermediate_size, num_experts_per_tok): transformers lets a
# negative one through, and the step failed on meta building a tensor of it.
_SIZE_PREFIXES = ("num_", "n_")
# "_embeddings" and "_positions": a table of learned positions (OPT's max_position_embeddings,
# GPT-2's n_positions) of -5 failed on meta as "negative dimension -3", and Llama's, which
# RoPE never builds, was taken as it was. "_window": the tokens a sliding-window layer sees
# (mistral's, qwen2's sliding_window); -5 was taken, and its step printed as the model's.
_SIZE_SUFFIXES = ("_size", "_dim", "_rank", "_heads", "_experts", "_tok", "_layers",
                  "_embeddings", "_positions", "_window")  # fmt: skip


def check_architecture_sizes(model_type: str, fields: dict[str, Any], config: Any) -> None:
    """No size of the architecture's own below 0, and an MoE that routes each token to
    at least one of its experts (0 per token, with experts, built a model whose MoE
    layers pass nothing on: its step's peak was printed as the model's)."""
    kind = printable(model_type)
    for key, value in fields.items():
        named = key.startswith(_SIZE_PREFIXES) or key.endswith(_SIZE_SUFFIXES)
        if named and isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise UserError(
                f"the {kind} config's {quoted(key)} is {value:,}: a size is 0 or more",
                "fix config.json",
            )
    per = getattr(config, "num_experts_per_tok", None)
    experts = [getattr(config, name, None) for name in _EXPERT_COUNTS]
    if per == 0 and any(isinstance(n, int) and n > 0 for n in experts):
        raise UserError(
            f"the {kind} config's num_experts_per_tok is 0: its MoE layers route each "
            "token to no expert",
            "give num_experts_per_tok of 1 or more (a dense model gives no experts)",
        )


def attention_implementation(model_type: str, attn: str) -> str:
    """What transformers builds the model's attention as for ``--attn``: "eager" when
    asked, and for ``auto`` where the architecture has no SDPA attention (gemma2, bloom,
    gpt_neo: transformers' own default for them is eager); "sdpa" otherwise. Asked for
    SDPA, such an architecture failed to build, and the one line said to check a config
    that was whole; plan --step, which has no --attn, could not plan it at all."""
    if attn == "eager":
        return "eager"
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    model_class = getattr(transformers, name, None) if isinstance(name, str) else None
    if getattr(model_class, "_supports_sdpa", True):
        return "sdpa"
    if attn == "auto":
        return "eager"
    raise UserError(
        f"{printable(model_type)} has no SDPA attention in transformers "
        f"{transformers.__version__}: --attn {attn} cannot build it",
        "use --attn eager (or auto, which builds it eager, as transformers does)",
    )


def load_error(model_type: str, exc: BaseException) -> UserError:
    """transformers' own refusal of a config (its strict validators raise their own
    error types), as one printable line of bounded length."""
    return UserError(
        f"the {printable(model_type)} config does not load ({error_text(exc)})", "fix config.json"
    )


def error_text(exc: BaseException) -> str:
    """transformers' (or torch's) message for a config it refused, on one printable line;
    its type where it gave none (a MemoryError read "does not load ()")."""
    return exception_text(exc, name=False) or exception_text(exc)


# The heads a config's ``architectures`` may name whose model has an lm_head over the
# vocabulary (what the step's log-probs are taken from).
_LM_HEADS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_lm_head(model_type: str, fields: dict[str, Any]) -> None:
    """A config whose ``architectures`` names only other heads (a reward model's
    ``LlamaForSequenceClassification``, a token classifier) was stepped as the causal LM of
    its sizes, and its peak printed as that model's: its own head scores, over no
    vocabulary, and takes no log-probs."""
    names = fields.get("architectures")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        return  # none given (or not a list of names): the causal LM of model_type is meant
    if any(name.endswith(_LM_HEADS) for name in names):
        return
    shown = ", ".join(quoted(name) for name in names[:3])
    raise UserError(
        f"the {printable(model_type)} config's architectures names {shown}: a head with no "
        "lm_head over the vocabulary, while memprobe step simulates a causal LM's "
        "log-prob step",
        "give a causal LM's config (architectures ...ForCausalLM), or drop architectures "
        "to step the causal LM of these sizes",
    )


def check_unquantized(model_type: str, fields: dict[str, Any]) -> None:
    """A quantized checkpoint's config (``quantization_config``: GPTQ, AWQ, bitsandbytes,
    fp8) was stepped as the unquantized model of its sizes, every weight in --dtype and
    trained with its gradient and optimizer state, and its peak printed as this model's.
    Its weights are 4 or 8 bits and frozen (a QLoRA step trains adapters), which memprobe
    does not build: a peak several times too high, without a word."""
    quant = fields.get("quantization_config")
    if quant is None:
        return
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    how = f", quant_method {quoted(method)}" if isinstance(method, str) else ""
    raise UserError(
        f"the {printable(model_type)} config is a quantized checkpoint's "
        f"(it gives a quantization_config{how}): memprobe step builds its weights in "
        "--dtype and trains them all, which is not this model's memory",
        "drop quantization_config from config.json to step the unquantized model of these sizes",
    )


# What a causal LM does to its logits between its lm_head and the loss, in transformers'
# modeling code, by the config field that sets it and the values that leave them as they
# are: gemma2/3's softcap (divide, tanh, multiply), granite's divisor, cohere's, falcon_h1's
# and muse's factors. A hidden-family kernel takes the hidden states and the lm_head weight
# and computes the log-probs of hidden @ weight.T: none of these.
_LOGIT_TRANSFORMS: dict[str, tuple[float, ...]] = {
    "final_logit_softcapping": (0.0,),
    "logits_scaling": (1.0,),
    "logit_scale": (1.0,),
    "lm_head_multiplier": (1.0,),
    "output_multiplier": (1.0,),
}


def logit_transform(config: Any) -> str | None:
    """``field=value`` for a transform ``config``'s model applies to its logits after the
    lm_head, or None. Read only where the config class declares the field (with its
    default, as a gemma2 config that leaves the softcap out still has 30.0): an extra key in
    another architecture's config.json is no field its model reads."""
    for name, neutral in _LOGIT_TRANSFORMS.items():
        if not hasattr(type(config), name):
            continue
        value = getattr(config, name, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if value not in neutral:
            return f"{name}={value:g}"
    return None
