"""The GPU peers (Liger-Kernel, Cut Cross-Entropy): unavailable here, and their adapters'
sign and shape against tiny fake modules with the libraries' call signatures."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from memprobe.errors import UserError
from memprobe.kernels import KernelUnavailable, get_spec, kernel_names
from memprobe.kernels.peers import PEERS, unavailable_reason
from memprobe.measure import measure
from memprobe.measure.meta_backend import simulate_step
from memprobe.records import Case

NEEDS = {
    "liger_cross_entropy": "liger-kernel",
    "liger_fused_linear_ce": "liger-kernel",
    "cce_linear_ce": "cut-cross-entropy",
}


def _loss(logits: torch.Tensor, target: torch.Tensor, reduction: str) -> torch.Tensor:
    assert reduction == "none"  # the adapters ask for the per-token loss
    return F.cross_entropy(logits.float(), target, reduction="none").to(logits.dtype)


def _liger_cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
                         reduce=None, reduction="mean", **_):  # fmt: skip
    assert input.dim() == 2 and target.dim() == 1
    return _loss(input, target, reduction)


def _liger_fused_linear_cross_entropy(input, weight, target, bias=None, ce_weight=None,
                                      ignore_index=-100, lse_square_scale=0.0,
                                      label_smoothing=0.0, reduction="mean", **_):  # fmt: skip
    assert input.dim() == 2 and weight.shape[1] == input.shape[1]
    return _loss(input @ weight.T, target, reduction)


def _cce_linear_cross_entropy(e, c, targets, bias=None, ignore_index=-100, softcap=None,
                              reduction="mean", shift=False, **_):  # fmt: skip
    return _loss(e @ c.T, targets, reduction)


@pytest.fixture
def fake_peers(monkeypatch):
    """Importable ``liger_kernel.transformers.functional`` and ``cut_cross_entropy``."""
    liger = types.ModuleType("liger_kernel")
    transformers = types.ModuleType("liger_kernel.transformers")
    functional = types.ModuleType("liger_kernel.transformers.functional")
    functional.liger_cross_entropy = _liger_cross_entropy  # type: ignore[attr-defined]
    functional.liger_fused_linear_cross_entropy = _liger_fused_linear_cross_entropy  # type: ignore[attr-defined]
    cce = types.ModuleType("cut_cross_entropy")
    cce.linear_cross_entropy = _cce_linear_cross_entropy  # type: ignore[attr-defined]
    for module in (liger, transformers, functional, cce):
        monkeypatch.setitem(sys.modules, module.__name__, module)


@pytest.fixture
def no_peers(monkeypatch):
    """Neither library importable, whatever this machine has installed."""
    for name in ("liger_kernel", "liger_kernel.transformers",
                 "liger_kernel.transformers.functional", "cut_cross_entropy"):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError


def logits_reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logits.double().log_softmax(-1).gather(-1, targets[..., None])[..., 0]


@pytest.mark.parametrize("name", ["liger_fused_linear_ce", "cce_linear_ce"])
def test_hidden_peers_return_log_probs_of_shape_b_s(fake_peers, name):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (2, 5), generator=gen)
    out = get_spec(name).fn(hidden, weight, targets)  # type: ignore[call-arg]
    assert out.shape == (2, 5) and out.dtype == torch.float32
    expected = logits_reference(hidden @ weight.T, targets)
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
    assert (out <= 0).all()  # log-probs, not losses
    out.sum().backward()  # the gradient flows back to both inputs
    assert hidden.grad is not None and weight.grad is not None


def test_liger_cross_entropy_returns_log_probs_of_shape_b_s(fake_peers):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 4, 13, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 13, (3, 4), generator=gen)
    out = get_spec("liger_cross_entropy").fn(logits, targets)
    assert out.shape == (3, 4) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), logits_reference(logits, targets))
    assert get_spec("liger_cross_entropy").consumes_logits


def test_missing_packages_and_no_cuda_are_reasons(no_peers, monkeypatch):
    for name, pypi in NEEDS.items():
        reason = unavailable_reason(name)
        assert reason is not None and reason.startswith(f"needs CUDA + {pypi}")
        assert "cannot be simulated on meta" in str(unavailable_reason(name, "meta"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "not installed: pip install liger-kernel" in str(
        unavailable_reason("liger_cross_entropy")
    )
    hidden = torch.zeros(1, 2, 4)
    with pytest.raises(KernelUnavailable, match="pip install cut-cross-entropy"):
        PEERS["cce_linear_ce"].fn(hidden, torch.zeros(3, 4), torch.zeros(1, 2, dtype=torch.long))  # type: ignore[call-arg]
    assert unavailable_reason("local_chunked") is None  # not a peer


def test_peers_join_no_default_list_where_they_cannot_run():
    for peers in (False, True):
        names = kernel_names(inputs=None, peers=peers)
        assert not set(PEERS) & set(names) or torch.cuda.is_available()
    assert not set(PEERS) & set(kernel_names(inputs=None))


def test_peers_on_meta_and_cpu_are_skipped_rows_that_say_why():
    for device in ("meta", "cpu"):
        run = measure(Case("liger_fused_linear_ce", 1, 64, 256, "bf16", hidden=32, device=device))
        assert run.status == "skipped" and run.note.startswith("needs CUDA + liger-kernel")
        assert run.floor_bytes is not None and run.peak_bytes is None


def test_a_peers_memory_is_not_guessed_on_meta():
    with pytest.raises(UserError, match="cannot be simulated on meta"):
        simulate_step(Case("cce_linear_ce", 1, 64, 256, "bf16", hidden=32))


def test_kernels_lists_the_peers_with_why_they_are_unavailable(run_cli, no_peers):
    code, out, _ = run_cli("kernels")
    assert code == 0
    for name, pypi in NEEDS.items():
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(name))
        assert f"unavailable: needs CUDA + {pypi}" in line
