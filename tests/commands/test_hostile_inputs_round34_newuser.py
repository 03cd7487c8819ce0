"""Round 34, a new user's pass: the README followed from the top, then real work (a step of
one's own profiled, --what-if on it, a Hugging Face config stepped, a kernel gated)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hostile import one_line, user_module
from torch import nn

from memprobe.attribute import attribute
from memprobe.attribute.what_if import what_if
from memprobe.kernels import get_kernel
from memprobe.profile import profile_step

VOCAB, HIDDEN = 4096, 64


def _lm(device: torch.device) -> nn.Module:
    return nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)).to(
        device=device, dtype=torch.bfloat16
    )


def plain_step(device: torch.device, *, seq: int, optimizer: bool) -> None:
    """The README's step: the logits kept in a variable, F.cross_entropy on a float copy."""
    model = _lm(device)
    opt = torch.optim.AdamW(model.parameters()) if optimizer else None
    ids = torch.randint(0, VOCAB, (1, seq), device=device)
    logits = model(ids)
    F.cross_entropy(logits.float().view(-1, VOCAB), ids.view(-1)).backward()
    if opt is not None:
        opt.step()


def hf_step(
    device: torch.device, *, batch: int, seq: int, upcast_first: bool, kernel: str = ""
) -> None:
    """Hugging Face's loss: logits[:, :-1] against labels[:, 1:], flattened with view(-1, V)."""
    model = _lm(device)
    ids = torch.randint(0, VOCAB, (batch, seq), device=device)
    logits = model(ids)
    if kernel:
        (-get_kernel(kernel)(logits[:, :-1].contiguous(), ids[:, 1:]).mean()).backward()
        return
    if upcast_first:
        shift = logits.float()[:, :-1].contiguous()
    else:
        shift = logits[:, :-1].contiguous().float()
    F.cross_entropy(shift.view(-1, VOCAB), ids[:, 1:].reshape(-1)).backward()


@functools.cache
def _profiled(step: Any, **kw: Any) -> dict:
    return profile_step(functools.partial(step, **kw), "meta")


# Class A: --what-if re-inferred the shape on the spliced trace, where the swapped-in kernel
# leaves no softmax over [N, V] to read it from: the logits the step still holds at the new
# peak were "forward activations" in the predicted breakdown (the same block the recorded
# reading calls logits-family), unless --vocab/--tokens/--batch were given.
@pytest.mark.parametrize(
    ("seq", "kernel"),
    [
        (2048, "local_chunked"),
        (2048, "local_tiled"),
        (1024, "local_chunked"),
        (512, "local_tiled"),
    ],
)
def test_what_if_breakdown_keeps_the_held_logits_in_the_logits_family(
    seq: int, kernel: str
) -> None:
    snap = _profiled(plain_step, seq=seq, optimizer=True)
    w = what_if(snap, kernel, chunk_size=256)
    given = what_if(snap, kernel, chunk_size=256, vocab=VOCAB, tokens=seq, batch=1)
    assert w.predicted_breakdown == given.predicted_breakdown
    parts = dict(w.predicted_breakdown)
    # The bf16 logits the step's variable holds through the optimizer step.
    assert parts.get("logits-family", 0) >= seq * VOCAB * 2


# Class B: F.cross_entropy(shift.view(-1, V), ...) labels only the flattened [B·(S−1), V]:
# read unshifted, N = B·S was one row short per sequence, the lm_head's logits and their
# gradient fell out of the logits family, and --what-if refused the step ("a fused loss?").
@pytest.mark.parametrize(
    ("batch", "seq", "upcast_first"),
    [(2, 1024, False), (2, 1024, True), (1, 2048, False), (3, 512, True), (4, 256, False)],
)
def test_a_flattened_shifted_loss_is_read_and_cut(batch: int, seq: int, upcast_first: bool) -> None:
    snap = _profiled(hf_step, batch=batch, seq=seq, upcast_first=upcast_first)
    shapes = attribute(snap).inference
    assert (shapes.batch, shapes.seq, shapes.vocab) == (batch, seq, VOCAB)
    assert shapes.loss_tokens == batch * (seq - 1)
    w = what_if(snap, "local_chunked", chunk_size=256)
    assert w.shifted and w.shape == (batch, seq - 1, VOCAB)
    assert w.predicted_peak_bytes < w.recorded_peak_bytes


def test_the_flattened_shifted_loss_predicts_the_kernels_own_step() -> None:
    """The prediction against the step written with the kernel: equal but for the loss's
    own copy of the shifted targets (reshape(-1) of ids[:, 1:]), which the cut keeps."""
    batch, seq = 2, 1024
    w = what_if(
        _profiled(hf_step, batch=batch, seq=seq, upcast_first=False),
        "local_chunked",
        chunk_size=1024,
    )
    own = attribute(
        _profiled(hf_step, batch=batch, seq=seq, upcast_first=False, kernel="local_chunked")
    )
    targets_copy = batch * (seq - 1) * 8
    assert 0 <= w.predicted_peak_bytes - own.peak_allocated_bytes <= 2 * targets_copy


# Class D: a step that raises its own ValueError / AssertionError / TypeError /
# AttributeError (no op raised it) was told "meta tensors hold no values ... try --device
# cpu", where it fails the same way; an op's error on meta keeps that hint.
OWN_RAISES = {
    "raise ValueError": "    raise ValueError('bad batch')\n",
    "a failed assert": "    assert x.shape == (11,), 'wrong shape'\n",
    "a TypeError": "    len(5)\n",
    "an AttributeError": "    x.no_such_attribute\n",
}


@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("bug", list(OWN_RAISES.values()), ids=list(OWN_RAISES))
def test_a_steps_own_raise_is_not_blamed_on_meta(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bug: str, device: str
) -> None:
    monkeypatch.chdir(tmp_path)
    body = "import torch\ndef step(device):\n    x = torch.zeros(10, device=device)\n" + bug
    name = user_module(tmp_path, "r34_raise", body)
    err = one_line(*run_cli("profile", f"{name}:step", "--device", device))
    assert "in its own Python code" in err and "try --device cpu" not in err, err


def test_an_ops_error_on_meta_keeps_the_meta_hint(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    body = "import torch\ndef step(device):\n    torch.zeros(10, device=device).sum().item()\n"
    name = user_module(tmp_path, "r34_item", body)
    err = one_line(*run_cli("profile", f"{name}:step"))
    assert "try --device cpu" in err and "own Python code" not in err, err
