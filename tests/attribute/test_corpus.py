"""Every reading of the attribution corpus against the truth of the program that made it.

The programs (tests/attribute/corpus.py) run on meta through the tracker and come out
as snapshots a CUDA run could have written: no memprobe labels, torch-style stacks.
"""

from __future__ import annotations

from typing import Any

import corpus
import pytest

from memprobe.attribute import Findings, attribute
from memprobe.attribute.categories import LOGITS, OPTIMIZER
from memprobe.attribute.frames import is_internal

_CACHE: dict[str, dict[str, Any]] = {}


def snapshot(name: str) -> dict[str, Any]:
    if name not in _CACHE:
        _CACHE[name] = corpus.BY_NAME[name].snapshot()
    return _CACHE[name]


def reading(name: str) -> Findings:
    return attribute(snapshot(name), top=50)


LMS = [p.name for p in corpus.PROGRAMS if p.truth.vocab is not None]
NOT_LMS = [p.name for p in corpus.PROGRAMS if p.truth.vocab is None]


@pytest.mark.parametrize("name", LMS)
def test_language_models_read_their_true_shapes(name: str) -> None:
    truth = corpus.BY_NAME[name].truth
    inf = reading(name).inference
    assert inf.logits_path
    assert (inf.batch, inf.seq, inf.vocab, inf.hidden) == (
        truth.batch,
        truth.seq,
        truth.vocab,
        truth.hidden,
    ), inf.evidence
    assert inf.tokens == truth.batch * truth.seq  # type: ignore[operator]
    assert inf.logits_dtype == truth.logits_dtype
    assert inf.loss_tokens == truth.loss_rows
    assert inf.confidence == "high", inf.alternatives
    # The reading says what it rests on: the split names its direct evidence.
    split = next(e for e in inf.evidence if e.startswith(f"B = {truth.batch:,}, S = "))
    assert any(word in split for word in ("arange", "mask", "B·(S−1)"))


@pytest.mark.parametrize("name", NOT_LMS)
def test_models_without_an_lm_head_get_no_logits_label(name: str) -> None:
    f = reading(name)
    assert not f.inference.logits_path
    assert f.inference.confidence == "none"
    assert not any(b.logits for b in f.findings)
    assert LOGITS not in dict(f.breakdown)


@pytest.mark.parametrize("name", [p.name for p in corpus.PROGRAMS if p.truth.categories])
def test_categories_a_trainer_recognizes(name: str) -> None:
    breakdown = dict(reading(name).breakdown)
    for category in corpus.BY_NAME[name].truth.categories:
        assert breakdown.get(category, 0) > 0, breakdown


def test_previous_steps_adam_state_is_optimizer_state_not_other() -> None:
    f = reading("adam_previous_state")
    before = [b for b in f.findings if b.alloc_index is None and b.size == 10000 * 256 * 4]
    states = [b for b in before if b.category == OPTIMIZER]
    assert len(states) == 4, [(b.category, b.category_reason) for b in before]  # 2 × exp_avg(_sq)
    assert dict(f.breakdown).get("other", 0) == 0


def test_two_iterations_read_like_one() -> None:
    one, two = reading("adam_previous_state").inference, reading("two_iterations").inference
    assert (two.batch, two.seq, two.vocab, two.hidden, two.logits_dtype) == (
        one.batch,
        one.seq,
        one.vocab,
        one.hidden,
        one.logits_dtype,
    )


def test_the_users_line_is_never_libc_or_a_thread() -> None:
    f = reading("gpt_rotary_fp32")
    for b in f.findings:
        assert b.frame is None or not is_internal(b.frame)
        assert b.frame is None or "clone" not in b.frame.name
        if b.phase == "backward":
            assert b.frame is None  # the engine's thread: C++ frames only


def test_without_op_stacks_b_and_s_stay_unsplit() -> None:
    """Python frames only (no ``at::_ops`` names): nothing names S directly, so the
    reading is [N = B·S], whatever sizes would fit a split."""
    snap = snapshot("gpt_rotary_fp32")
    python_only = {
        **snap,
        "device_traces": [
            [{**e, "frames": [f for f in e.get("frames", []) if f["line"]]} for e in trace]
            for trace in snap["device_traces"]
        ],
    }
    inf = attribute(python_only).inference
    assert inf.batch is None and inf.seq is None
    assert "N=B·S" in inf.shape_text()
