"""The input protocol object: one way to make, run and check a step of either kind."""

from __future__ import annotations

import pytest
import torch

from memprobe.measure import measure
from memprobe.measure.meta_backend import simulate_tracker
from memprobe.measure.protocol import HIDDEN, LOGITS, floor_bytes, protocol_for
from memprobe.records import Case

LOGITS_CASE = Case("local_chunked", 1, 512, 4096, "bf16", 128, device="meta")
HIDDEN_CASE = Case("linear_local_chunked", 1, 512, 4096, "bf16", 128, device="meta", hidden=64)


def test_each_kernel_has_its_protocol() -> None:
    assert protocol_for("local_chunked") is LOGITS
    assert protocol_for("fused_linear_chunked") is HIDDEN


@pytest.mark.parametrize("case", [LOGITS_CASE, HIDDEN_CASE], ids=["logits", "hidden"])
def test_the_floor_is_the_leaves_and_their_gradients(case: Case) -> None:
    protocol = protocol_for(case.kernel)
    inputs = protocol.make_inputs(case, "meta")
    leaves = protocol.leaves(inputs)
    assert floor_bytes(case) == 2 * sum(t.nbytes for _, t in leaves)
    # The tracer counts exactly those leaves from the start, labelled as inputs.
    ops = [e.op for e in simulate_tracker(case).events[: len(leaves)]]
    assert ops == [f"input: {label}" for label, _ in leaves]


@pytest.mark.parametrize("case", [LOGITS_CASE, HIDDEN_CASE], ids=["logits", "hidden"])
def test_forward_and_backward_give_a_gradient_per_leaf(case: Case) -> None:
    protocol = protocol_for(case.kernel)
    inputs = protocol.make_inputs(case, "meta")
    out = protocol.forward(case)(inputs)
    assert tuple(out.shape) == (case.batch, case.tokens)
    grads = protocol.backward(out, inputs)
    assert [tuple(g.shape) for g in grads] == [tuple(t.shape) for _, t in protocol.leaves(inputs)]


@pytest.mark.parametrize("kernel", ["local_chunked", "fused_linear_chunked"])
def test_the_float64_reference_matches_the_kernel_on_cpu(kernel: str) -> None:
    protocol = protocol_for(kernel)
    case = protocol.verify_case(kernel, "fp32", 7, (1, 9, 50))
    inputs = protocol.verify_inputs(case, seed=0, scale=3.0, offset=0.0)
    ref_out, ref_grads = protocol.reference(case, inputs)
    out = protocol.forward(case)(inputs)
    grads = protocol.backward(out, inputs)
    assert torch.allclose(out.double(), ref_out, atol=1e-4)
    for g, r in zip(grads, ref_grads, strict=True):
        assert torch.allclose(g.double(), r, atol=1e-4)


def test_the_hidden_family_is_skipped_across_ranks() -> None:
    run = measure(Case("linear_local_chunked", 1, 512, 4096, "bf16", 128, tp=2, hidden=64))
    assert run.status == "skipped" and "one device" in run.note
    assert LOGITS.unfit(LOGITS_CASE) is None
