"""The gaps real snapshots showed after issue 12: simulated clocks, frames that are not
strings, HF's shifted loss, forward-only lm_heads, vocabulary-parallel shards, diff
call sites. Each test fails on the code before its fix."""

from __future__ import annotations

import json

import training_fixtures as tf

from memprobe.attribute import attribute
from memprobe.render.findings_html import write_findings_page
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
    dumped = json.dumps(f.to_json())
    assert '"times": "simulated"' in dumped and '"lifetime_us": 1' not in dumped
    page = write_findings_page(f, tmp_path / "p.html", title="t").read_text()
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
