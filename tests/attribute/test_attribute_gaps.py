"""The gaps real snapshots showed after issue 12: simulated clocks, frames that are not
strings, HF's shifted loss, forward-only lm_heads, vocabulary-parallel shards, diff
call sites. Each test fails on the code before its fix."""

from __future__ import annotations

import json

import training_fixtures as tf

from memprobe.attribute import attribute
from memprobe.io.codec import to_json
from memprobe.render.attribute_page import write_attribute_page
from memprobe.render.findings_text import render_findings


def _text(findings) -> str:
    return "\n".join(render_findings(findings))


# -- a meta run's clock times the simulation, not a device ----------------------


def _simulated(snap: dict) -> dict:
    return {**snap, "memprobe": {"synthesized": True, "clock": "simulation"}}


def test_simulated_times_are_never_presented_as_measured(tmp_path) -> None:
    f = attribute(_simulated(tf.gpt_snapshot()), min_block_bytes=1)
    assert f.times == "simulated"
    assert f.trace_start_us is None and f.peak_time_us is None
    assert all(b.lifetime_us is None and b.alloc_time_us is None for b in f.findings)
    text = _text(f)
    assert "simulated: no times" in text
    assert "lived " not in text and "t=+" not in text
    dumped = json.dumps(to_json(f))
    assert '"times": "simulated"' in dumped and '"lifetime_us": 1' not in dumped
    page = write_attribute_page((f,), tmp_path / "p.html", title="t").read_text()
    assert "simulated: no times" in page and " µs" not in page
    # A measured trace keeps its times.
    measured = attribute(tf.gpt_snapshot())
    assert measured.times == "measured" and "t=+" in _text(measured)


# -- diff: two call sites of one helper are two contributors --------------------

HELPER = "/home/me/gpt/helpers.py"


def _two_callers(first: int, second: int) -> dict:
    """A helper at helpers.py:12 called from train.py:40 and train.py:70."""
    tr = tf.Trace()
    for line, size in ((40, first), (70, second)):
        frames = tf._cpp("mm") + [tf._f("project", HELPER, 12), tf._f("step", tf.TRAIN, line),
                                  tf._f("main", tf.TRAIN, 90)]  # fmt: skip
        tr.alloc(size, frames)
    return tf.snapshot_of(tr)


def test_diff_tells_two_call_sites_of_one_helper_apart(tmp_path, run_cli) -> None:
    from memprobe.attribute.diff import diff_findings
    from memprobe.snapshot import write_snapshot

    mib = tf.MiB
    a, b = _two_callers(64 * mib, 64 * mib), _two_callers(64 * mib, 192 * mib)
    d = diff_findings(attribute(a), attribute(b))
    helper = [c for c in d.contributors if c.frame is not None and c.frame.filename == HELPER]
    assert len(helper) == 2
    grown, same = helper
    assert grown.caller is not None and grown.caller.line == 70
    assert grown.delta_bytes == 128 * mib and same.delta_bytes == 0
    pa = write_snapshot(a, tmp_path / "a.pickle")
    pb = write_snapshot(b, tmp_path / "b.pickle")
    code, out, _ = run_cli("diff", str(pa), str(pb))
    assert code == 0 and "helpers.py:12 in project <- train.py:70 in step" in out
    code, out, _ = run_cli("diff", str(pa), str(pb), "--json")
    rows = json.loads(out)["contributors"]
    assert len(rows) == 2 and rows[0]["delta_bytes"] == 128 * mib
    assert set(rows[0]) == {"frame", "op", "category", "bytes_a", "bytes_b", "delta_bytes"}


# -- Hugging Face's shifted loss: [B·(S−1), V] beside [B·S, H] -------------------


def test_shifted_loss_reads_as_b_s_with_the_loss_on_s_minus_1() -> None:
    f = attribute(tf.hf_shifted_step())  # B = 1, S = 1000, V = 32000, float32
    inf = f.inference
    assert (inf.batch, inf.seq, inf.vocab, inf.loss_tokens) == (1, 1000, 32000, 999)
    assert inf.shape_text() == "[B=1, S=1,000 (loss on 999), V=32,000]"
    assert inf.confidence == "high" and inf.hidden == 768
    assert any("B·(S−1)" in r for r in inf.evidence)
    shapes = {(b.op, b.shape) for b in f.logits_family}
    assert ("aten::mm", (1, 1000, 32000)) in shapes  # the lm_head output keeps all S
    assert ("aten::clone", (1, 999, 32000)) in shapes  # the contiguous shifted copy
    assert ("aten::_log_softmax", (1, 999, 32000)) in shapes
    assert len(f.logits_family) == 6
    assert "logits [B=1, S=1,000 (loss on 999), V=32,000]" in _text(f)


def test_shifted_loss_with_a_batch_and_with_hints() -> None:
    inf = attribute(tf.hf_shifted_step(batch=2, seq=512)).inference
    assert (inf.batch, inf.seq, inf.vocab, inf.loss_tokens) == (2, 512, 32000, 1022)
    given = attribute(tf.hf_shifted_step(), vocab=32000).inference
    assert (given.seq, given.loss_tokens) == (1000, 999)


# -- a forward pass with no loss: the lm_head's [N, V] is still the logits -------


def test_forward_only_lm_head_is_logits_without_a_loss() -> None:
    for op in ("bmm", "mm"):
        f = attribute(tf.forward_only(lm_head_op=op))
        inf = f.inference
        assert inf.forward_only and inf.logits_path
        assert (inf.tokens, inf.vocab, inf.hidden) == (tf.Gpt().tokens, 10000, 768)
        assert inf.confidence in ("medium", "low")
        (block,) = f.logits_family
        assert block.op == f"aten::{op}" and block.shape == (tf.Gpt().tokens, 10000)
        assert "(forward only, no loss)" in _text(f) and "no LM logits path" not in _text(f)


def test_a_per_layer_matmul_is_not_an_lm_head() -> None:
    # The MLP's [N, 4H] from [4H, H] weights, one per layer: never read as [N, V].
    snap = tf.forward_only()
    snap["device_traces"][0] = [
        e for e in snap["device_traces"][0] if e["size"] != tf.Gpt().tokens * 10000 * 4
    ]
    assert not attribute(snap).inference.logits_path
    assert not attribute(tf.cnn_snapshot()).inference.logits_path


# -- vocabulary-parallel: each rank holds [N, V/k] -------------------------------


def test_vocab_parallel_shard_with_the_full_vocab_given() -> None:
    for ranks in (2, 4):
        f = attribute(tf.vocab_parallel_step(ranks), vocab=10000)
        inf = f.inference
        assert (inf.vocab, inf.shards, inf.full_vocab) == (10000 // ranks, ranks, 10000)
        assert f"V={10000 // ranks:,} per rank (V=10,000 / {ranks} ranks)" in inf.shape_text()
        assert "vocabulary-parallel" in inf.evidence[0]
        assert {b.shape for b in f.logits_family} == {(4, 512, 10000 // ranks)}
        assert {b.dtype for b in f.logits_family} == {"float32"}
    # Without the hint, the all_reduce on the loss path says V is likely one rank's.
    inf = attribute(tf.vocab_parallel_step()).inference
    assert inf.vocab == 5000 and inf.per_rank and "per rank?" in inf.shape_text()
    assert any("all_reduce" in r for r in inf.evidence)
    # A single-GPU run given its own V stays whole.
    whole = attribute(tf.gpt_snapshot(), vocab=10000).inference
    assert whole.shards is None and not whole.per_rank and whole.vocab == 10000


def test_diff_text_shows_the_largest_changes_either_way(tmp_path, run_cli) -> None:
    # A fix that frees far more than anything grows must be among the shown lines;
    # a line that did not change is not a change.
    from memprobe.snapshot import write_snapshot

    mib = tf.MiB
    pa = write_snapshot(_two_callers(512 * mib, 64 * mib), tmp_path / "a.pickle")
    pb = write_snapshot(_two_callers(64 * mib, 96 * mib), tmp_path / "b.pickle")

    def shown(*args: str) -> list[str]:
        code, out, _ = run_cli("diff", str(pa), str(pb), *args)
        assert code == 0
        return [line.split()[0] for line in out.splitlines() if "helpers.py:12" in line]

    assert shown("--top", "1") == ["-448.00"]
    assert shown("--top", "5") == ["+32.00", "-448.00"]
    same = write_snapshot(_two_callers(512 * mib, 64 * mib), tmp_path / "same.pickle")
    code, out, _ = run_cli("diff", str(pa), str(same))
    assert "by source line and op: no line's bytes changed" in out
