"""Meta ops answered from memory (``memprobe.measure.memo``) change nothing: the trace of a
step is the same event by event, with and without the memo."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from memprobe.measure.memo import MetaMemo

pytest.importorskip("transformers")

from memprobe.profile.hf import HFStep, config_from_dict  # noqa: E402
from memprobe.profile.step import trace_hf_step  # noqa: E402

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
}


def _signature(tracked: Any) -> list[tuple[Any, ...]]:
    """Every event, with storages numbered by the event that allocated them (keys are
    addresses, which differ from run to run)."""
    alloc_at: dict[int, int] = {}
    out = []
    for i, e in enumerate(tracked.events):
        if e.action == "alloc":
            alloc_at[e.storage] = i
        out.append((e.action, alloc_at[e.storage], e.nbytes, e.shape, e.dtype, e.op, e.phase))
    return out


@pytest.mark.parametrize(
    "options",
    [
        {"kernel": "unchunked", "checkpointing": True},
        {"kernel": "fused_linear_chunked", "param_dtype": "fp32", "optimizer": "sgd"},
        {"kernel": "local_tiled", "attn": "eager", "dtype": "fp32", "batch": 2},
    ],
)
def test_a_remembered_trace_equals_a_plain_one(options: dict[str, Any]) -> None:
    step = HFStep(config_from_dict(dict(LLAMA)), tokens=48, chunk_size=16, **options)
    plain, _ = trace_hf_step(step, memo=False)
    remembered, _ = trace_hf_step(step, memo=True)
    assert _signature(remembered) == _signature(plain)
    assert remembered.peak_bytes == plain.peak_bytes > 0
    assert remembered.phase_peaks == plain.phase_peaks
    assert remembered.marks == plain.marks
    assert remembered.attention == plain.attention


def remembered_op(func: Any, memo: MetaMemo) -> Any:
    """``func`` called through ``memo``, as the tracker calls it."""
    return lambda *args, **kwargs: memo.call(func, args, kwargs)


def test_only_fresh_outputs_or_written_inputs_are_remembered() -> None:
    memo = MetaMemo()
    x = torch.empty(4, 6, dtype=torch.bfloat16, device="meta")
    add = remembered_op(torch.ops.aten.add.Tensor, memo)
    first, second = add(x, x), add(x, x)
    assert memo.hits == 1
    assert second.shape == first.shape and second.stride() == first.stride()
    assert second.untyped_storage()._cdata != first.untyped_storage()._cdata
    # The same value as another type promotes differently: not the same question.
    ints = torch.empty(4, dtype=torch.int64, device="meta")
    add_int = remembered_op(torch.ops.aten.add.Tensor, memo)
    assert add_int(ints, 1).dtype == torch.int64
    assert add_int(ints, 1.0).dtype == torch.float32
    # A view shares its input's storage: always run.
    view = remembered_op(torch.ops.aten._unsafe_view.default, memo)
    hits = memo.hits
    for _ in range(2):
        out = view(x, [24])
        assert out.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert memo.hits == hits
    # In place: answered with the very input it wrote into, at its position.
    add_ = remembered_op(torch.ops.aten.add_.Tensor, memo)
    y, z = (torch.empty(4, 6, dtype=torch.bfloat16, device="meta") for _ in range(2))
    assert add_(y, z) is y and add_(z, y) is z
    assert memo.hits == hits + 1
    assert add_(x, x) is x
    assert memo.hits == hits + 2
    # One tensor given twice at the first run: which position it stands for is unknown,
    # so that question always runs.
    fresh = MetaMemo()
    add_twice = remembered_op(torch.ops.aten.add_.Tensor, fresh)
    assert add_twice(x, x) is x and add_twice(y, z) is y and add_twice(z, y) is z
    assert fresh.hits == 0


def test_a_factory_op_follows_the_default_dtype() -> None:
    memo = MetaMemo()
    empty = remembered_op(torch.ops.aten.empty.memory_format, memo)
    before = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        assert empty([3], device="meta").dtype == torch.float64
    finally:
        torch.set_default_dtype(before)
    assert empty([3], device="meta").dtype == before


def test_the_traces_of_a_process_share_a_memo_and_stay_exact() -> None:
    """Every remembering trace answers from one memory: a step at another token count
    asks the layers' weight ops again, answered without their kernels, and each trace
    still equals a plain one."""
    from memprobe.measure.memo import trace_memo

    steps = [HFStep(config_from_dict(dict(LLAMA)), tokens=t, chunk_size=16) for t in (48, 32)]
    shared = trace_memo()
    assert trace_memo() is shared
    first, _ = trace_hf_step(steps[0], memo=True)
    before = shared.hits
    second, _ = trace_hf_step(steps[1], memo=True)
    # Alone, the second step's memory would start empty: its own first layer misses.
    alone = MetaMemo()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("memprobe.profile.run.trace_memo", lambda: alone)
        trace_hf_step(steps[1], memo=True)
    assert shared.hits - before > alone.hits
    for step, remembered in zip(steps, (first, second), strict=True):
        plain, _ = trace_hf_step(step, memo=False)
        assert _signature(remembered) == _signature(plain)
        assert remembered.peak_bytes == plain.peak_bytes


def test_a_full_memo_starts_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's memory is bounded: at its limit the next answer starts it afresh."""
    memo = MetaMemo()
    monkeypatch.setattr(MetaMemo, "LIMIT", 2)
    x = torch.empty(4, device="meta")
    for n in (1, 2, 3):
        memo.call(torch.ops.aten.add.Tensor, (x, torch.empty(4, device="meta")), {"alpha": n})
    assert len(memo._answers) == 1
