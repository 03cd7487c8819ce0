"""Every reading of the attribution corpus against the truth of the program that made it.

The programs (tests/attribute/corpus.py) run on meta through the tracker and come out
as snapshots a CUDA run could have written: no memprobe labels, torch-style stacks.
"""

from __future__ import annotations

import functools
from typing import Any

import corpus
import pytest

from memprobe.attribute import Findings, attribute, attribute_devices
from memprobe.attribute.categories import LOGITS, OPTIMIZER
from memprobe.attribute.diff import diff_findings
from memprobe.attribute.frames import is_internal
from memprobe.commands.diff import render_diff
from memprobe.io.codec import to_json
from memprobe.io.sizes import format_bytes
from memprobe.render.console import plain_lines
from memprobe.render.findings_text import render_devices, render_findings

_CACHE: dict[str, dict[str, Any]] = {}


def snapshot(name: str) -> dict[str, Any]:
    if name not in _CACHE:
        _CACHE[name] = corpus.BY_NAME[name].snapshot()
    return _CACHE[name]


def reading(name: str) -> Findings:
    return attribute(snapshot(name), top=50)


LMS = [p.name for p in corpus.PROGRAMS if p.truth.vocab is not None and p.oom is None]
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


@functools.cache
def _iterations(steps: int) -> Findings:
    return attribute(corpus.adam_iterations(steps).snapshot(), top=50)


def _stable(f: Findings) -> tuple[Any, ...]:
    """A reading's claims and the scores of the readings it beat, without the counts
    that grow with the trace's length."""
    i = f.inference
    return (i.tokens, i.batch, i.seq, i.vocab, i.hidden, i.family, i.logits_dtype,
            i.logits_path, i.confidence, i.loss_tokens, i.forward_only, i.evidence[0],
            i.alternatives)  # fmt: skip


def test_two_iterations_read_like_one() -> None:
    one, two = reading("adam_previous_state").inference, reading("two_iterations").inference
    assert (two.batch, two.seq, two.vocab, two.hidden, two.logits_dtype) == (
        one.batch,
        one.seq,
        one.vocab,
        one.hidden,
        one.logits_dtype,
    )


def test_a_long_trace_of_one_repeated_iteration_reads_like_one() -> None:
    """Ten iterations' counts (ids, activations) are weighed per step: the scores, the
    margin over other readings and so the confidence stay what one iteration gives (at
    127 iterations, counted whole, the margin fell under "high")."""
    snap, period = corpus.repeated_training(10 * 800)
    assert len(snap["device_traces"][0]) > 9 * period
    assert _stable(attribute(snap, top=5)) == _stable(_iterations(1))


@pytest.mark.parametrize("steps", [2, 3])
def test_several_iterations_read_exactly_like_one(steps: int) -> None:
    one = _iterations(1)
    many = reading("two_iterations") if steps == 2 else _iterations(steps)
    assert _stable(many) == _stable(one)
    assert one.inference.confidence == "high"
    # Every iteration's logits family is found, each block read the same way.
    assert len(many.logits_family) == steps * len(one.logits_family)
    assert {(b.size, b.dtype, b.shape) for b in many.logits_family} == {
        (b.size, b.dtype, b.shape) for b in one.logits_family
    }


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


def test_an_oom_reads_the_allocator_at_that_moment_not_at_snapshot_time() -> None:
    snap = snapshot("gpt_oom")
    f = reading("gpt_oom")
    (oom,) = f.ooms
    truth = corpus.GPT_OOM
    assert (oom.requested_bytes, oom.device_free_bytes) == (truth.requested, truth.device_free)
    assert oom.op == "aten::_log_softmax" and oom.frame and oom.frame.name == "lm_loss"
    # Reserved then: the segments that existed at that entry (a segment event count).
    trace = snap["device_traces"][0]
    grown = sum(e["size"] for e in trace[: oom.index] if e["action"] == "segment_alloc")
    freed = sum(e["size"] for e in trace[: oom.index] if e["action"] == "segment_free")
    before = (
        sum(s["total_size"] for s in snap["segments"])
        - sum(e["size"] for e in trace if e["action"] == "segment_alloc")
        + sum(e["size"] for e in trace if e["action"] == "segment_free")
    )
    v = oom.verdict
    assert v.reserved_bytes == before + grown - freed
    assert v.free_in_reserved_bytes == v.reserved_bytes - oom.allocated_bytes
    # The activations freed as the exception unwound coalesced into a larger free block
    # than any the request could have had: the verdict must not read the snapshot's.
    assert v.largest_free_block is not None
    assert v.largest_free_block < f.allocator.largest_free_block
    assert v.largest_free_block < truth.requested <= v.free_in_reserved_bytes
    assert v.kind == "fragmentation"
    # It is the fp32 LM's forward: read as one, with no loss to rest on.
    inf = f.inference
    t = corpus.GPT_TRUTH
    assert (inf.batch, inf.seq, inf.vocab, inf.hidden, inf.logits_dtype) == (
        t.batch, t.seq, t.vocab, t.hidden, t.logits_dtype
    )  # fmt: skip
    assert inf.forward_only and inf.confidence != "high"


def test_the_oom_comes_first_and_the_failed_device_leads() -> None:
    found = attribute_devices(corpus.two_devices_oom_on_1(), top=5)
    assert [f.device for f in found] == [1, 0]
    lines = render_devices(found, top=5)
    assert lines[0].startswith("2 devices with a trace (device 1: peak ")
    oom = found[0].ooms[0]
    head = next(i for i, line in enumerate(lines) if line.startswith("OOM #1 on device 1 "))
    assert head < 5  # the first screen, before the peak and the shapes
    assert head < next(i for i, line in enumerate(lines) if line.startswith("peak allocated"))
    assert f"requested {corpus.GPT_OOM.requested:,} B (14.65 MiB)" in lines[head]
    moment = lines[head + 1]
    assert moment.startswith("  at that moment: 2.00 MiB free on the device, ")
    assert format_bytes(oom.verdict.reserved_bytes) + " reserved" in moment  # type: ignore[arg-type]
    assert f"largest free block {format_bytes(oom.verdict.largest_free_block)}" in moment  # type: ignore[arg-type]
    assert lines[head + 2].startswith("  verdict: fragmentation")


def _differences(a: str | Findings, b: str | Findings) -> dict[str, Any]:
    fa = reading(a) if isinstance(a, str) else a
    fb = reading(b) if isinstance(b, str) else b
    return {d.what: (d.a, d.b) for d in diff_findings(fa, fb).differences}


def test_diff_names_autocast_and_the_dtype() -> None:
    found = _differences("gpt_rotary_fp32", "gpt_rotary_autocast")
    assert found.pop("logits dtype") == ("float32", "bfloat16")
    copies = dict(reading("gpt_rotary_autocast").breakdown)["autocast weight copies"]
    assert found == {"autocast": (0, copies)}


def test_diff_names_different_models() -> None:
    found = _differences("gpt_rotary_fp32", "hf_shifted")
    assert "model" in found and found["vocabulary"] == (10000, 8000)
    assert found["batch"] == (4, 2) and found["sequence"] == (96, 160)
    # A model without an LM head against one with: the models differ, nothing else claimed.
    assert set(_differences("gpt_rotary_fp32", "encoder_classifier")) == {"model"}


def test_diff_names_batch_and_sequence_of_one_model() -> None:
    one = reading("gpt_rotary_fp32")
    bigger = attribute(corpus.gpt_program(8, 192).snapshot(), top=50)
    assert _differences(one, bigger) == {"batch": (4, 8), "sequence": (96, 192)}
    assert _differences(one, one) == {}
    text = [line for part in render_diff(diff_findings(one, bigger)) for line in plain_lines(part)]
    head = text.index("what differs between the runs (from each file's reading):")
    starts = [next(i for i, x in enumerate(text) if x.startswith(w)) for w in ("by c", "by s")]
    assert head < starts[0] < starts[1]
    assert text[head + 1] == "  batch: 4 -> 8 (each file's B, S split)"


@pytest.mark.parametrize("name", ["gpt_rotary_autocast", "adam_previous_state", "cnn"])
def test_every_reading_states_its_evidence_in_text_and_json(name: str) -> None:
    f = reading(name)
    lines = render_findings(f, top=8)
    shapes = next(line for line in lines if line.startswith("shapes: "))
    if f.inference.logits_path:
        # The split is a claim: the line it rests on is printed, however long the list.
        split = next(e for e in f.inference.evidence if e.startswith("B = "))
        assert f"  - {split}" in lines
    else:
        assert shapes == f"shapes: [B, S, V] unknown: {f.inference.evidence[0]}"
        assert "unknown: no LM logits path found: loss/softmax blocks are " in shapes
    # Each group at the peak: its line, then why it is that category.
    start = next(i for i, line in enumerate(lines) if line.startswith("live at the peak: "))
    end = lines.index("", start)
    listed = lines[start + 1 : end]
    assert len(listed) == 2 * min(8, len(f.groups))
    for line, why, g in zip(listed[::2], listed[1::2], f.groups, strict=False):
        assert g.category in line and why == f"     why {g.category}: {g.reason}" and g.reason
    data = to_json(f)
    assert [row["reason"] for row in data["groups"]] == [g.reason for g in f.groups]
    for b, row in zip(f.findings, data["findings"], strict=True):
        assert row["category_reason"] == b.category_reason != ""


def test_the_html_page_leads_with_the_oom_at_its_moment() -> None:
    from memprobe.render.attribute_page import attribute_page

    found = attribute_devices(corpus.two_devices_oom_on_1(), top=5)
    page = attribute_page(found, title="two devices")
    v = found[0].ooms[0].verdict
    largest = f"{format_bytes(v.largest_free_block)} ({v.largest_free_block:,} bytes)"  # type: ignore[arg-type]
    oom = page.index("<h2>Out of memory</h2>")
    assert page.index('class="big"') < oom < page.index("<h2>Device 1</h2>")
    assert page.index("largest free block then</dt><dd>" + largest) > oom
    assert f"{corpus.GPT_OOM.requested:,} bytes" in page
    assert "<th" in page and ">why<" in page and found[0].groups[0].reason in page


def test_autocast_copies_read_from_torchs_cast_frame_whatever_op_allocated() -> None:
    """Real CUDA stacks name the storage's op (``empty_strided``) above ``_to_copy`` and
    ``at::autocast::cached_cast``: the cast frame alone says autocast."""
    snap = snapshot("gpt_rotary_autocast")
    cast = {"name": "at::autocast::cached_cast(c10::ScalarType, at::Tensor const&)",
            "filename": "??", "line": 0}  # fmt: skip
    trace = []
    for e in snap["device_traces"][0]:
        frames = e.get("frames", [])
        if e["action"] == "alloc" and any("_to_copy" in f["name"] for f in frames):
            frames = [
                {**f, "name": "at::_ops::empty_strided::call(...)"}
                if "_to_copy" in f["name"]
                else f
                for f in frames
            ]
            frames.insert(2, cast)
        trace.append({**e, "frames": frames})
    real = attribute({**snap, "device_traces": [trace]}, top=50)
    copies = dict(reading("gpt_rotary_autocast").breakdown)["autocast weight copies"]
    assert dict(real.breakdown)["autocast weight copies"] == copies
    assert real.inference.logits_dtype == "bfloat16" and real.inference.confidence == "high"
