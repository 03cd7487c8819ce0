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
