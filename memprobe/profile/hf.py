"""A Hugging Face causal LM's training step, built from its ``config.json`` alone.

``transformers`` is an optional extra (``pip install 'memprobe[hf]'``); without it every
entry point here is one line that says how to install it. The model is built on the
device the step is given (``meta``: no weights, any size), so one training step can be
traced by :func:`memprobe.profile.trace_step` like any user's step:

forward (activation checkpointing on or off), the log-probabilities of the targets
through one of memprobe's kernels, on the model's logits or (a hidden-family kernel)
on the final hidden states and the lm_head weight, backward, and the optimizer step.
The step marks where its log-prob kernel runs (:func:`memprobe.profile.phases.mark`),
so its share of the peak is known exactly.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memprobe.errors import UserError
from memprobe.io.text import printable, quoted
from memprobe.kernels.peers import unavailable_reason
from memprobe.kernels.registry import get_spec
from memprobe.kernels.user import is_import_path
from memprobe.measure.step import checked_output, own_backward_failures, own_failures
from memprobe.profile.hf_config import (
    attention_implementation,
    check_architecture_sizes,
    check_lm_head,
    check_ratios,
    check_sizes,
    check_text_only,
    check_unquantized,
    error_text,
    has_attention_heads,
    load_error,
    logit_transform,
    read_config_json,
)
from memprobe.profile.hf_files import no_config_json, no_model_type, padding_error
from memprobe.profile.hf_quiet import hf_logging_off, quiet_transformers
from memprobe.profile.optimizers import make_optimizer
from memprobe.profile.phases import mark
from memprobe.records import Event, normalize_dtype, too_large

INSTALL_HINT = "install it with: pip install 'memprobe[hf]'"
OPTIMIZERS = ("adamw", "sgd", "none")
# --attn: what the step's attention runs. "auto": F.scaled_dot_product_attention with
# the kernel CUDA would pick; "sdpa-math": the same call on torch's math path;
# "eager": the model's own matmul-softmax attention.
ATTENTIONS = ("auto", "sdpa-math", "eager")
STEP_DTYPES = ("bf16", "fp16", "fp32")

# Marks the step leaves in the trace (see logprob_windows in memprobe.profile.step).
LOGPROB_START, LOGPROB_END = "logprob forward start", "logprob forward end"
BACKWARD_START, LOGPROB_GRAD = "backward start", "logprob backward end"


def require_transformers() -> Any:
    """The ``transformers`` module, or one line saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise UserError(
            "memprobe step needs transformers, which is not installed", INSTALL_HINT
        ) from None
    return transformers


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}  # fmt: skip


def load_config(path: str | os.PathLike[str]) -> Any:
    """The model config in ``path``: a ``config.json`` file, or a directory holding one."""
    transformers = require_transformers()
    source = Path(path)
    file = source / "config.json" if source.is_dir() else source
    # A config.json that is a link leading nowhere is there (exists() follows it): read,
    # it is named for what it is, not "no config.json in DIR".
    if source.is_dir() and not file.exists() and not file.is_symlink():
        raise no_config_json(source)
    data = read_config_json(file)
    if not isinstance(data, dict):
        raise UserError(
            f"--config {file} holds a JSON {_JSON_KINDS.get(type(data), 'value')}, not an object",
            "give a model's config.json",
        )
    model_type = data.get("model_type")
    if model_type is None:
        raise no_model_type(file, data)
    if not isinstance(model_type, str):
        raise UserError(
            f"--config {file} gives model_type {quoted(model_type)}, not a name",
            "a Hugging Face config.json names its model_type",
        )
    return config_from_dict(data, transformers)


def config_from_dict(data: dict[str, Any], transformers: Any = None) -> Any:
    """A transformers config from a ``config.json``'s fields; an architecture this
    transformers does not know, or one without a causal-LM head, is one line."""
    transformers = transformers or require_transformers()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    fields = dict(data)
    model_type = fields.pop("model_type")
    version = transformers.__version__
    if model_type not in transformers.CONFIG_MAPPING:
        # Quoted short: a model_type of a megabyte was the one line, a megabyte long.
        raise UserError(
            f"unknown architecture {quoted(model_type)} (transformers {version} does not know it)",
            "check the config's model_type, or upgrade transformers",
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UserError(
            f"architecture {model_type!r} has no causal-LM model in transformers {version}",
            "memprobe step trains causal LMs (Llama, Qwen, Mistral, Gemma, ...)",
        )
    config_class = transformers.CONFIG_MAPPING[model_type]
    check_text_only(model_type, config_class, fields, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    check_lm_head(model_type, fields)
    check_unquantized(model_type, fields)
    aliases = dict(getattr(config_class, "attribute_map", {}) or {})
    check_sizes(model_type, fields, aliases, heads=has_attention_heads(config_class))
    try:
        # Its logger would print warnings of its own on stderr, quoting the config's text
        # as is (control characters and all), beside memprobe's one line.
        with hf_logging_off():
            config = transformers.AutoConfig.for_model(model_type, **fields)
    except Exception as exc:  # its strict validators raise their own types
        raise load_error(model_type, exc) from None
    # Outputs by name: a config's return_dict false (saved for TorchScript export) packed
    # them in tuples that transformers' causal LMs read by name, and the step failed on meta
    # ("'tuple' object has no attribute 'last_hidden_state'"). Packing allocates nothing.
    config.return_dict = True
    check_ratios(model_type, fields, aliases)  # what transformers' validators let through
    check_architecture_sizes(model_type, fields, config)
    return config


def learned_positions(model: torch.nn.Module) -> int | None:
    """How many positions the model learned an embedding for (GPT-2's ``wpe``, OPT's and
    BioGPT's ``embed_positions``, which skip their first ``offset`` rows); None for a
    model that computes its positions (RoPE, ALiBi, sinusoids), whose reach has no
    table's end."""
    get_inputs = getattr(model, "get_input_embeddings", None)
    inputs = get_inputs() if callable(get_inputs) else None
    counts = [
        module.num_embeddings - int(getattr(module, "offset", 0) or 0)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Embedding)
        and module is not inputs
        and ("pos" in name.rsplit(".", 1)[-1] or name.endswith("wpe"))
    ]
    if counts and min(counts) < 1:
        # No sequence runs: "give --tokens 0 or fewer" named a count no flag takes, and
        # plan --step planned 0 tokens and refused an --tokens it was never given.
        kind = printable(str(getattr(getattr(model, "config", None), "model_type", "")))
        raise UserError(
            f"the {kind} model learned positions for no token (its table of positions "
            "is empty): no sequence runs",
            "give a config with 1 or more positions (max_position_embeddings / n_positions)",
        )
    return min(counts) if counts else None


def check_positions(model: torch.nn.Module, tokens: int, model_type: str) -> None:
    """A sequence no longer than the positions the model learned. Past them, a real step
    indexes outside the table (a device-side assert on CUDA), while on meta no index is
    read: a GPT-2 of 8 positions was simulated at 64 tokens, its peak printed as if it
    could run."""
    positions = learned_positions(model)
    if positions is not None and tokens > positions:
        raise UserError(
            f"the {printable(model_type)} model learned positions for {positions:,} tokens; "
            f"a sequence of {tokens:,} indexes past them (a real step fails there)",
            f"give --tokens {positions:,} or fewer, or a config with more positions "
            "(max_position_embeddings / n_positions)",
        )


def _torch_dtype(name: str, flag: str) -> torch.dtype:
    key = normalize_dtype(name)
    if key not in STEP_DTYPES:
        raise UserError(
            f"{flag} {name!r} is not one of {', '.join(STEP_DTYPES)}", f"e.g. {flag} bf16"
        )
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[key]


@dataclass(frozen=True, eq=False)
class HFStep:
    """One training step of ``config``'s causal LM at ``batch`` x ``tokens``: a step for
    :func:`memprobe.profile.trace_step` (call it with the device).

    ``dtype``: what the model computes in; ``param_dtype``: what its parameters are
    stored in (the same, or fp32 for mixed precision with float32 master weights: the
    model runs in ``dtype``, the optimizer steps float32 copies of the parameters with
    float32 gradients and copies them back). Checked when made.
    """

    config: Any
    tokens: int
    batch: int = 1
    kernel: str = "local_chunked"
    chunk_size: int | None = 1024
    checkpointing: bool = False
    optimizer: str = "adamw"
    dtype: str = "bf16"
    param_dtype: str | None = None
    attn: str = "auto"
    # Refuse a sequence longer than the positions the model learned (plan --step, which
    # probes counts on either side of its answer, turns it off).
    check_positions: bool = True

    def __post_init__(self) -> None:
        for name in ("tokens", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UserError(f"--{name} must be a positive integer, got {value!r}", "e.g. 1")
        try:
            get_spec(self.kernel)
        except ValueError as exc:
            raise UserError(str(exc), "see `memprobe kernels`") from None
        if unavailable_reason(self.kernel, "meta") is not None:
            # The step runs on meta only: a Triton peer failed in its forward, and the one
            # line said to "try --device cpu" or "measure it on a GPU (--device cuda)",
            # flags neither step nor plan --step has.
            raise UserError(
                f"{self.kernel} is a Triton kernel: its memory cannot be simulated on meta, "
                "where the whole step runs",
                "pick a kernel memprobe simulates (`memprobe kernels`), or profile your own "
                "step with it on a GPU: memprobe profile pkg.mod:step --device cuda",
            )
        distributed = get_spec(self.kernel).distributed
        if distributed and self.vocab_shards == 1:
            raise UserError(
                # Not "runs one GPU": with --cp or --fsdp the step is rank 0 of several.
                f"{self.kernel} shards the vocabulary over tensor-parallel ranks; this step has "
                "none (no --tp)",
                "pick a single-device kernel (`memprobe kernels`), or add --tp N",
            )
        if not distributed and self.vocab_shards > 1:
            from memprobe.kernels.registry import kernel_names

            raise UserError(
                f"--tp {self.vocab_shards} shards the lm_head's vocabulary, which "
                f"{self.kernel} cannot take",
                f"use --kernel {' or '.join(kernel_names(distributed=True))}",
            )
        past = too_large(self.batch, self.tokens, self.local_vocab)
        if past is not None:  # the token ids' tensors pass too: blamed on the config
            raise UserError(f"--batch x --tokens: {past}", "give a smaller --batch or --tokens")
        if self.optimizer not in OPTIMIZERS:
            raise UserError(
                f"--optimizer {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}",
                "e.g. --optimizer adamw",
            )
        if self.attn not in ATTENTIONS:
            raise UserError(
                f"--attn {self.attn!r} is not one of {', '.join(ATTENTIONS)}", "e.g. --attn auto"
            )
        compute = _torch_dtype(self.dtype, "--dtype")
        params = _torch_dtype(self.param_dtype or self.dtype, "--param-dtype")
        if params != compute and params != torch.float32:
            raise UserError(
                "--param-dtype differs from --dtype: only fp32 master weights are modelled",
                "use --param-dtype fp32, or the same as --dtype",
            )
        transform = logit_transform(self.config) if self.hidden_route else None
        if transform is not None and not is_import_path(self.kernel):
            # (A user's own hidden-family kernel may apply it: its code is its own.)
            kind = printable(str(getattr(self.config, "model_type", "")))
            raise UserError(
                f"the {kind} model changes its logits after the lm_head ({transform}), "
                f"which {self.kernel} skips: it takes the hidden states and the lm_head "
                "weight and computes the log-probs of hidden @ weight.T, so its step is not "
                "this model's",
                "pick a logits kernel (`memprobe kernels`), e.g. --kernel local_chunked",
            )
        if self.hidden_route and not self.hidden_route_simulated:
            # The hidden route calls the base model and the lm_head apart, so FSDP2 found
            # two roots and the step failed: "FSDP requires a single root module ... (fix
            # the step and rerun)", after a plan's other kernels had run for minutes.
            raise UserError(
                f"{self.kernel} under FSDP2 (--fsdp/--cp) is not simulated: the hidden "
                "route runs the lm_head outside the model's forward, which FSDP2 wraps",
                "drop --fsdp/--cp, or pick a logits kernel from `memprobe kernels`",
            )

    @property
    def hidden_route(self) -> bool:
        """The kernel takes the final hidden states and the lm_head weight (no logits)."""
        return get_spec(self.kernel).inputs == "hidden"

    @property
    def hidden_route_simulated(self) -> bool:
        """Whether a hidden-family kernel can run in this step's layout (the sharded step:
        not under FSDP2)."""
        return True

    @property
    def vocab(self) -> int:
        return int(self.config.vocab_size)

    @property
    def vocab_shards(self) -> int:
        """The ranks the lm_head's vocabulary is split over (tensor parallel)."""
        return 1

    @property
    def local_vocab(self) -> int:
        """The vocabulary ids whose logits this rank computes."""
        return self.vocab // self.vocab_shards

    def logprob_kwargs(self) -> dict[str, Any]:
        """What the log-prob kernel is given besides its tensors (a tp group)."""
        return {}

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def master_weights(self) -> bool:
        return _torch_dtype(self.param_dtype or self.dtype, "--param-dtype") != _torch_dtype(
            self.dtype, "--dtype"
        )

    @property
    def build_dtype(self) -> torch.dtype:
        """What the model is built in: ``dtype`` (master weights are copies made later)."""
        return _torch_dtype(self.dtype, "--dtype")

    def simulation(self, device: str) -> contextlib.AbstractContextManager[str]:
        """Where the step is traced for ``device``: here, there (a sharded step runs in a
        fake world of ranks: :mod:`memprobe.profile.sharded`)."""
        return contextlib.nullcontext(device)

    def category_of(self, event: Event) -> str | None:
        """What ``event`` is when this step knows better than the plain breakdown."""
        return None

    def sharded_summary(self) -> dict[str, Any] | None:
        """A sharded step's layout and per-rank arithmetic, once traced (None here)."""
        return None

    def build(self, device: torch.device) -> torch.nn.Module:
        """The model on ``device`` in ``dtype``, weights initialized there (no download)."""
        from transformers import AutoModelForCausalLM

        implementation = attention_implementation(str(self.config.model_type), self.attn)
        try:
            # No autograd while weights are initialized: they are set up, not computed
            # (and the tracker's phase stays "setup" until the forward really starts).
            with torch.device(device), torch.no_grad():
                model = AutoModelForCausalLM.from_config(
                    self.config,
                    dtype=self.build_dtype,
                    attn_implementation=implementation,
                )
        # torch's modules assert their arguments (nn.Embedding: a padding_idx inside the
        # vocabulary): a config transformers takes can still fail here, before any step.
        # A model reading a field its config lacks (a text_config where the architecture
        # takes none, a multimodal config whose text sizes are nested) raises
        # AttributeError: said as the step failing "on meta", with a hint to try cpu.
        except (ValueError, TypeError, KeyError, AssertionError, AttributeError) as exc:
            padding_error(self.config, exc)
            raise UserError(
                f"transformers cannot build this model ({error_text(exc)})", "check the config"
            ) from None
        if self.checkpointing:
            # Non-reentrant: what transformers' Trainer and torch recommend.
            kwargs = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:  # transformers before 5.x
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.train()
        return model

    def __call__(self, device: torch.device) -> None:
        self.run(device)

    def learned_positions(self) -> int | None:
        """The positions the model learned an embedding for (:func:`learned_positions`),
        read off the model built on meta."""
        with quiet_transformers():
            return learned_positions(self.build(torch.device("meta")))

    def run(
        self, device: torch.device, on_model: Callable[[torch.nn.Module], None] | None = None
    ) -> None:
        """The step on ``device``; ``on_model`` sees the model once it is built."""
        with quiet_transformers():
            model = self.build(device)
            if self.check_positions:
                check_positions(model, self.tokens, self.config.model_type)
            if on_model is not None:
                on_model(model)
            self._train(model, device)

    def _train(self, model: torch.nn.Module, device: torch.device) -> None:
        params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
        # Mixed precision: the optimizer holds float32 master copies of the parameters.
        with torch.no_grad():
            master = [p.float() for p in params] if self.master_weights else params
        optimizer = make_optimizer(self.optimizer, master)
        ids = torch.randint(0, self.vocab, (self.batch, self.tokens), device=device)
        targets = torch.randint(0, self.vocab, (self.batch, self.tokens), device=device)
        fn: Any = own_failures(self.kernel, get_spec(self.kernel).fn, device)
        lm: Any = model  # transformers' PreTrainedModel: base_model, get_output_embeddings
        reached: list[bool] = []

        def mark_grad(grad: torch.Tensor) -> None:
            # Backward reaches the logits (or hidden states): the kernel's backward is done.
            reached.append(True)
            mark(LOGPROB_GRAD)

        if self.hidden_route:
            hidden = lm.base_model(input_ids=ids, use_cache=False).last_hidden_state
            weight = lm.get_output_embeddings().weight
            # Its head's cast (mamba, xlstm: float32 residual stream, bf16 lm_head): a
            # no-op where the dtypes match, as they do in every model that does not cast.
            hidden = hidden.to(weight.dtype)
            hidden.register_hook(mark_grad)
            grad_from = hidden.requires_grad or weight.requires_grad
            mark(LOGPROB_START)
            out = fn(hidden, weight, targets, chunk_size=self.chunk_size)
        else:
            logits = lm(input_ids=ids, use_cache=False).logits
            logits.register_hook(mark_grad)
            grad_from = logits.requires_grad
            mark(LOGPROB_START)
            out = fn(logits, targets, chunk_size=self.chunk_size, **self.logprob_kwargs())
            del logits  # the kernel holds what it saved; the step keeps no other reference
        # The contract the sweep and plan hold a kernel to (one log-prob per target).
        logprobs = checked_output(out, targets, grad_from=grad_from)
        del out
        loss = -logprobs.mean()
        mark(LOGPROB_END)
        del logprobs
        mark(BACKWARD_START)
        with own_backward_failures(self.kernel, device, reached, targets.numel()):
            loss.backward()
        del loss
        if not reached:
            # A result that is not computed from the kernel's input (a fresh leaf): the
            # backward stopped at it and never reached the model, so no gradient was
            # made and the peak read about half the real step's.
            raise ValueError(
                "the kernel's log-probs do not depend on its "
                f"{'hidden states' if self.hidden_route else 'logits'}: the backward never "
                "reached the model"
            )
        if self.master_weights:
            for m, p in zip(master, params, strict=True):
                m.grad = p.grad.float() if p.grad is not None else None
                p.grad = None
        if optimizer is not None:
            optimizer.step()
        if self.master_weights:
            with torch.no_grad():
                for m, p in zip(master, params, strict=True):
                    p.copy_(m)
