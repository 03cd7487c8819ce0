"""The memo (``memprobe.measure.memo``) in kernels' meta simulations changes nothing: every
kernel's trace is the same event by event with and without it, and a dispatch mode below
the tracker still sees every op."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memprobe.kernels import KERNELS, get_spec
from memprobe.measure.memo import MetaMemo
from memprobe.measure.meta_backend import simulate_tracker
from memprobe.records import Case

A = torch.ops.aten


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def looks(out: object) -> object:
    """What an op's outputs are, short of their identity."""
    if isinstance(out, torch.Tensor):
        return (
            tuple(out.shape),
            out.stride(),
            out.storage_offset(),
            out.dtype,
            out.untyped_storage().nbytes(),
        )
    assert isinstance(out, (tuple, list))
    return (type(out), [looks(item) for item in out])


# Each op twice through the memo: the first runs it, the second is made from what the
# first answered; both must look as torch's own answer does.
CALLS = [
    ("log_softmax", A._log_softmax.default, lambda: (meta(8, 32), -1, False)),
    (
        "log_softmax backward to bf16",
        A._log_softmax_backward_data.default,
        lambda: (meta(8, 32), meta(8, 32), -1, torch.bfloat16),
    ),
    ("add, broadcast", A.add.Tensor, lambda: (meta(8, 1), meta(1, 32))),
    ("transposed input", A.exp.default, lambda: (meta(8, 32).t(),)),
    ("max over a dim (two outputs)", A.max.dim, lambda: (meta(8, 32), 1, True)),
    ("a list out", A._foreach_mul.Scalar, lambda: ([meta(3), meta(5)], 2.0)),
    ("a bf16 copy", A._to_copy.default, lambda: (meta(8, 32),)),
]


@pytest.mark.parametrize(("name", "op", "make"), CALLS, ids=[c[0] for c in CALLS])
def test_a_remembered_answer_is_torchs(name, op, make):
    kwargs = {"dtype": torch.bfloat16} if op is A._to_copy.default else {}
    memo = MetaMemo()
    want = looks(op(*make(), **kwargs))
    first = memo.call(op, make(), kwargs)
    second = memo.call(op, make(), kwargs)
    assert looks(first) == looks(second) == want
    assert memo.hits == 1


@pytest.mark.parametrize(
    ("op", "extra"),
    [(A.resize_.default, ([6, 6],)), (A.t_.default, ()), (A.unsqueeze_.default, (0,))],
    ids=["resize_", "t_", "unsqueeze_"],
)
def test_an_op_that_changes_its_inputs_metadata_always_runs(op, extra):
    memo = MetaMemo()
    for _ in range(2):
        x = meta(2, 3)
        want = looks(op(meta(2, 3), *extra))
        memo.call(op, (x, *extra), {})
        assert looks(x) == want
    assert memo.hits == 0


def test_cpu_tensors_just_run():
    memo = MetaMemo()
    for _ in range(2):
        memo.call(A.add.Tensor, (torch.ones(2), torch.ones(2)), {})
        memo.call(A.add.Tensor, (meta(2), torch.tensor(1.0)), {})
    assert memo.hits == 0


def test_a_mode_below_sees_every_op():
    class Counting(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen += 1
            return func(*args, **(kwargs or {}))

    memo = MetaMemo()

    class Remembering(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return memo.call(func, args, kwargs or {})

    below = Counting()
    x = meta(4, 4)
    with below, Remembering():
        for _ in range(3):
            torch.exp(x)
    assert below.seen == 3


@pytest.mark.parametrize(
    ("kernel", "tp"),
    [(k, 1) for k in sorted(KERNELS)] + [("distributed", 2), ("chunked_distributed", 4)],
)
def test_every_kernels_trace_is_the_same_remembered(kernel, tp):
    """Event for event (what, how big, made by which op, in which phase), a simulation
    with every op run is the one with the memo."""
    hidden = 64 if get_spec(kernel).inputs == "hidden" else None
    case = Case(kernel, 2, 96, 256, chunk_size=64, tp=tp, hidden=hidden)

    def events(memo: bool) -> list[tuple[object, ...]]:
        tracker = simulate_tracker(case, capture_frames=False, memo=memo)
        return [(e.action, e.nbytes, e.shape, e.dtype, e.op, e.phase) for e in tracker.events]

    assert events(memo=True) == events(memo=False)
