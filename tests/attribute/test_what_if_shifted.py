"""``--what-if`` on a Hugging Face-style shifted loss: the loss runs on ``logits[:, :-1]``
against ``labels[:, 1:]``, so the kernel is simulated at S − 1 rows and the slice's copy is
part of the cut step. Held to the same step profiled with the other kernel, to the byte."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from memprobe.attribute import attribute
from memprobe.attribute.what_if import what_if
from memprobe.io.codec import to_json
from memprobe.kernels import get_kernel
from memprobe.profile import profile_step

VOCAB, HIDDEN, BATCH, SEQ, CHUNK = 4096, 64, 2, 128, 32
PAGE = 2 << 20


def shifted_step(device: torch.device, kernel: str, *, hold: int = 1, upcast: int = 0) -> None:
    """An embedding, an MLP and an lm_head in bf16; the loss is ``kernel``'s log-probs of
    the next token, on the logits' first S − 1 positions (as transformers' causal LMs)."""
    kw = {"device": device, "dtype": torch.bfloat16}
    model = nn.Sequential(
        nn.Embedding(VOCAB, HIDDEN, **kw),
        nn.Linear(HIDDEN, 4 * HIDDEN, **kw),
        nn.GELU(),
        nn.Linear(4 * HIDDEN, HIDDEN, **kw),
    )
    head = nn.Linear(HIDDEN, VOCAB, bias=False, **kw)
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()])
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), device=device)
    loss_fn = functools.partial(get_kernel(kernel), chunk_size=CHUNK)

    def logits_of() -> torch.Tensor:
        logits = head(model(ids))
        # Older transformers: logits.float() in the model's forward, then the shift.
        return logits.float() if upcast else logits

    if hold:  # the step keeps the logits and the shifted copies in variables through backward
        logits = logits_of()
        shift_logits = logits[:, :-1, :].contiguous()
        shift_labels = ids[:, 1:].contiguous()
        loss = -loss_fn(shift_logits, shift_labels).mean()
        loss.backward()
    else:  # only the loss holds them
        (-loss_fn(logits_of()[:, :-1, :].contiguous(), ids[:, 1:]).mean()).backward()
    opt.step()


@functools.cache
def profiled(kernel: str, **kw: int) -> dict:
    return profile_step(functools.partial(shifted_step, kernel=kernel, **kw), "meta")


@pytest.mark.parametrize("hold", [1, 0])
@pytest.mark.parametrize("kernel", ["local_chunked", "local_tiled", "unchunked"])
def test_what_if_predicts_the_shifted_step_with_the_other_kernel(kernel: str, hold: int) -> None:
    recorded = attribute(profiled(kernel, hold=hold))
    w = what_if(profiled("unchunked", hold=hold), kernel, chunk_size=CHUNK)
    assert w.predicted_peak_bytes == recorded.peak_allocated_bytes
    assert recorded.peak_reserved_bytes is not None
    assert abs(w.predicted_reserved_peak_bytes - recorded.peak_reserved_bytes) <= PAGE
    # Simulated at the loss's rows: S − 1 per sequence.
    assert w.shifted and w.shape == (BATCH, SEQ - 1, VOCAB) and w.dtype == "bfloat16"
    assert to_json(w)["shifted"] is True
    if kernel != "unchunked":
        # More than a float32 [B, S − 1, V] block is gone from the peak.
        assert w.saved_bytes > BATCH * (SEQ - 1) * VOCAB * 4


def test_the_shifted_step_is_read_from_memprobes_labels() -> None:
    shapes = attribute(profiled("unchunked")).inference
    assert (shapes.batch, shapes.seq, shapes.vocab) == (BATCH, SEQ, VOCAB)
    assert shapes.loss_tokens == BATCH * (SEQ - 1)


def test_an_upcast_before_the_shift_is_part_of_the_cut() -> None:
    """logits.float() then the shift: the float32 [B, S, V] copy goes with the loss step, and
    the kernel takes the bf16 logits themselves."""
    recorded = attribute(profiled("local_chunked", hold=0))
    w = what_if(profiled("unchunked", hold=0, upcast=1), "local_chunked", chunk_size=CHUNK)
    assert w.shape == (BATCH, SEQ - 1, VOCAB) and w.dtype == "bfloat16"
    assert w.predicted_peak_bytes == recorded.peak_allocated_bytes


@pytest.mark.parametrize("hold", [1, 0])
def test_a_shifted_step_recorded_with_a_chunked_kernel(hold: int) -> None:
    """memprobe's kernel on the shifted copy, found by its frames: the copy stands for the
    logits and the slice's backward stays as recorded; the naive loss's cost is exact."""
    truth = attribute(profiled("unchunked", hold=hold))
    w = what_if(profiled("local_chunked", hold=hold), "unchunked", chunk_size=CHUNK)
    assert w.predicted_peak_bytes == truth.peak_allocated_bytes
    assert w.shape == (BATCH, SEQ - 1, VOCAB)
