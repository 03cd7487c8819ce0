"""Which line attribution names: the user's call into memprobe's own kernels, the kernel
beside the op; and the evidence B and S are split on comes from ops that name a shape."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memprobe.attribute import attribute
from memprobe.attribute.frames import call_site
from memprobe.attribute.ops import shape_op
from memprobe.kernels import get_kernel
from memprobe.profile import profile_step
from memprobe.records import Frame
from memprobe.render.findings_text import render_findings

SITE = "/venv/lib/python3.12/site-packages"
KERNEL = Frame("_row_max", f"{SITE}/memprobe/kernels/local_chunked.py", 78)
KERNEL_OUTER = Frame("forward", "/src/memprobe/memprobe/kernels/local_chunked.py", 126)
USER = Frame("step", "/home/me/train.py", 9)
CALLER = Frame("main", "/home/me/train.py", 30)
HARNESS = Frame("measure", "/src/memprobe/memprobe/measure/traced.py", 40)
TORCH = Frame("apply", f"{SITE}/torch/autograd/function.py", 575)
CPP = Frame("at::_ops::empty_like::call", "??", 0)


@pytest.mark.parametrize(
    ("frames", "chain", "kernel"),
    [
        # The user's step called memprobe's kernel: the user's line, the kernel beside it.
        ((CPP, KERNEL, KERNEL_OUTER, TORCH, USER, CALLER), (USER, CALLER), KERNEL),
        ((KERNEL, USER), (USER,), KERNEL),
        # memprobe's harness ran the kernel (a sweep, measure()): the kernel is the line.
        ((CPP, KERNEL, TORCH, HARNESS, USER), (KERNEL, USER), None),
        ((KERNEL, KERNEL_OUTER, HARNESS), (KERNEL, KERNEL_OUTER), None),
        ((KERNEL,), (KERNEL,), None),
        # No kernel in the stack: as before.
        ((CPP, TORCH, USER, CALLER), (USER, CALLER), None),
        ((CPP, TORCH), (), None),
    ],
)
def test_call_site_names_the_users_call_into_memprobes_kernel(
    frames: tuple[Frame, ...], chain: tuple[Frame, ...], kernel: Frame | None
) -> None:
    found_chain, _via, found_kernel = call_site(frames)
    assert (found_chain, found_kernel) == (chain, kernel)


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("aten.ones.default", "mask"),
        ("aten::tril", "mask"),
        ("aten.new_full.default", "mask"),
        ("aten.full.default", "mask"),
        # These copy another tensor's shape: autograd's seed gradient is ones_like(loss).
        ("aten.ones_like.default", None),
        ("aten.full_like.default", None),
        ("aten::ones_like", None),
        ("aten.arange.start", "arange"),
    ],
)
def test_only_ops_that_name_a_shape_name_s(op: str, kind: str | None) -> None:
    assert shape_op(op) == kind


VOCAB, HIDDEN, TOKENS = 512, 64, 128


def _lm_step(device: torch.device) -> None:
    """The README's my_step, small: a cross-entropy and loss.backward() (ones_like(loss))."""
    model = nn.Sequential(
        nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(),
        nn.Linear(4 * HIDDEN, HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False),
    ).to(device)  # fmt: skip
    ids = torch.randint(0, VOCAB, (1, TOKENS), device=device)
    logits = model(ids)
    F.cross_entropy(logits.float().view(-1, VOCAB), ids.view(-1)).backward()


def test_a_backward_seed_is_no_mask_evidence() -> None:
    shapes = attribute(profile_step(_lm_step, "meta")).inference
    assert shapes.vocab == VOCAB and shapes.tokens == TOKENS
    assert not [e for e in shapes.evidence if "mask" in e and "[S, S] =" in e], shapes.evidence
    assert (shapes.batch, shapes.seq) == (None, None)


def _kernel_step(device: torch.device) -> None:
    logits = torch.randn(1, TOKENS, VOCAB, device=device, requires_grad=True)
    targets = torch.randint(0, VOCAB, (1, TOKENS), device=device)
    get_kernel("local_chunked")(logits, targets, chunk_size=32).sum().backward()


def test_the_peak_names_the_users_line_and_the_kernel_beside_it() -> None:
    findings = attribute(profile_step(_kernel_step, "meta"))
    assert findings.peak_frame is not None and findings.peak_frame.filename == __file__
    assert findings.peak_kernel is not None
    assert "/memprobe/kernels/local_chunked.py" in findings.peak_kernel.filename.replace("\\", "/")
    text = "\n".join(render_findings(findings))
    line = findings.peak_frame.line
    assert f"test_call_site.py:{line} in _kernel_step, inside memprobe's kernel at " in text
    made_in_kernel = [g for g in findings.groups if g.kernel is not None]
    assert made_in_kernel and all(g.frame == findings.peak_frame for g in made_in_kernel)
