"""Remembered meta ops answer exactly what torch answers, or torch runs."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memprobe.kernels import KERNELS, get_spec
from memprobe.measure import meta_ops
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


@pytest.fixture(autouse=True)
def _nothing_remembered():
    meta_ops._answers.clear()
    yield
    meta_ops._answers.clear()


# Each op twice through call(): the first runs it, the second is made from what the first
# answered; both must look as torch's own answer does.
CALLS = [
    ("log_softmax", A._log_softmax.default, lambda: (meta(8, 32), -1, False)),
    (
        "log_softmax backward to bf16",
        A._log_softmax_backward_data.default,
        lambda: (meta(8, 32), meta(8, 32), -1, torch.bfloat16),
    ),
    ("add, broadcast", A.add.Tensor, lambda: (meta(8, 1), meta(1, 32))),
    ("add, int + int", A.add.Tensor, lambda: (meta(4, dtype=torch.int64), 1)),
    ("add, int + float", A.add.Tensor, lambda: (meta(4, dtype=torch.int64), 1.0)),
    ("transposed input", A.exp.default, lambda: (meta(8, 32).t(),)),
    ("max over a dim (two outputs)", A.max.dim, lambda: (meta(8, 32), 1, True)),
    ("a list out", A._foreach_mul.Scalar, lambda: ([meta(3), meta(5)], 2.0)),
    ("a bf16 copy", A._to_copy.default, lambda: (meta(8, 32),)),
]


@pytest.mark.parametrize(("name", "op", "make"), CALLS, ids=[c[0] for c in CALLS])
def test_a_remembered_answer_is_torchs(name, op, make):
    kwargs = {"dtype": torch.bfloat16} if op is A._to_copy.default else {}
    want = looks(op(*make(), **kwargs))
    first = meta_ops.call(op, make(), kwargs)
    second = meta_ops.call(op, make(), kwargs)
    assert looks(first) == looks(second) == want
    assert [ok for _, ok in meta_ops.remembered()] == [True]


def test_int_and_float_scalars_are_different_keys():
    ints = meta_ops.call(A.add.Tensor, (meta(4, dtype=torch.int64), 1), {})
    floats = meta_ops.call(A.add.Tensor, (meta(4, dtype=torch.int64), 1.0), {})
    assert (ints.dtype, floats.dtype) == (torch.int64, torch.float32)


def test_an_in_place_op_returns_its_input_again():
    for _ in range(2):
        x = meta(4, 4)
        assert meta_ops.call(A.clamp_.default, (x, 0.0, 1.0), {}) is x
    assert [ok for _, ok in meta_ops.remembered()] == [True]


@pytest.mark.parametrize(
    ("op", "extra"),
    [(A.resize_.default, ([6, 6],)), (A.t_.default, ()), (A.unsqueeze_.default, (0,))],
    ids=["resize_", "t_", "unsqueeze_"],
)
def test_an_op_that_changes_its_inputs_metadata_always_runs(op, extra):
    for _ in range(2):
        x = meta(2, 3)
        want = looks(op(meta(2, 3), *extra))
        meta_ops.call(op, (x, *extra), {})
        assert looks(x) == want
    assert [ok for _, ok in meta_ops.remembered()] == [False]


def test_views_are_never_remembered():
    x = meta(8, 32)
    for _ in range(2):
        view = meta_ops.call(A.slice.Tensor, (x, 0, 0, 4), {})
        assert view.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert list(meta_ops.remembered()) == []


def test_the_default_dtype_is_part_of_the_key():
    args, kwargs = ([3],), {"device": torch.device("meta")}
    first = meta_ops.call(A.empty.memory_format, args, kwargs)
    was = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        second = meta_ops.call(A.empty.memory_format, args, kwargs)
    finally:
        torch.set_default_dtype(was)
    assert (first.dtype, second.dtype) == (was, torch.float64)


def test_cpu_tensors_and_subclasses_just_run():
    meta_ops.call(A.add.Tensor, (torch.ones(2), torch.ones(2)), {})
    meta_ops.call(A.add.Tensor, (meta(2), torch.tensor(1.0)), {})
    assert list(meta_ops.remembered()) == []


def test_a_mode_below_sees_every_op():
    class Counting(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen += 1
            return func(*args, **(kwargs or {}))

    class Remembering(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return meta_ops.call(func, args, kwargs or {})

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
    with every op run is the one with answers remembered, and the one answered from them."""
    hidden = 64 if get_spec(kernel).inputs == "hidden" else None
    case = Case(kernel, 2, 96, 256, chunk_size=64, tp=tp, hidden=hidden)

    def events() -> list[tuple[object, ...]]:
        tracker = simulate_tracker(case, capture_frames=False)
        return [(e.action, e.nbytes, e.shape, e.dtype, e.op, e.phase) for e in tracker.events]

    with meta_ops.uncached():
        ran = events()
    assert events() == ran
    assert events() == ran
