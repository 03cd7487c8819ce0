"""transformers run quietly on meta: its logging and warnings off, and the checks it makes
of input values (which meta tensors do not have) answered as a step's inputs make them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' logging and warnings off, and its data-dependent checks answered as
    the step's inputs make them: whole sequences (position ids 0..S-1), no padding. Each
    reads values, which meta tensors do not have, and failed the step of a whole config
    with a hint to check its sizes (gpt2 or openai-gpt given a pad_token_id, every bart,
    marian, pegasus or biogpt, which make an all-ones attention mask of their own).

    - ``find_packed_sequence_indices`` finds no packed sequences;
    - ``warn_if_padding_and_no_attention_mask`` (a warning, off here) warns of nothing;
    - a padding mask on meta is no padding: the only one a step's model sees is the
      all-ones mask it made itself, so SDPA's causal (or bidirectional) mask is skipped,
      as on the GPU (roformer and big_bird read it with ``.all()``)."""
    import warnings

    from transformers import masking_utils, modeling_utils

    answers: list[tuple[Any, str, Callable[..., Any]]] = [
        (masking_utils, "find_packed_sequence_indices", _no_packed_sequences),
        (modeling_utils.PreTrainedModel, "warn_if_padding_and_no_attention_mask", _no_warning),
    ]
    for name in ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa"):
        original = masking_utils.__dict__.get(name)
        if original is not None:
            answers.append((masking_utils, name, _meta_mask_as_none(original)))
    kept = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in answers]
    for owner, name, answer in answers:
        if owner.__dict__.get(name) is not None:
            setattr(owner, name, answer)
    try:
        with hf_logging_off(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for owner, name, original in kept:
            if original is not None:
                setattr(owner, name, original)


@contextlib.contextmanager
def hf_logging_off() -> Iterator[None]:
    """transformers' logger at errors only, its level put back after."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _no_packed_sequences(position_ids: torch.Tensor) -> None:
    return None


def _no_warning(model: Any, input_ids: torch.Tensor, attention_mask: Any) -> None:
    return None


def _meta_mask_as_none(original: Callable[..., Any]) -> Callable[..., Any]:
    def skip(padding_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> Any:
        if padding_mask is not None and padding_mask.is_meta:
            padding_mask = None
        return original(padding_mask, *args, **kwargs)

    return skip
