"""Attribution of realistic training-step snapshots: one test per defect class of issue 12."""

from __future__ import annotations

import json
from pathlib import Path

import training_fixtures as tf

from memprobe.attribute import attribute, attribute_devices
from memprobe.attribute.categories import GRADIENTS, LOGITS, OPTIMIZER, PARAMETERS
from memprobe.attribute.diff import diff_findings
from memprobe.attribute.frames import is_internal
from memprobe.attribute.ops import loss_evidence
from memprobe.records import Frame
from memprobe.render.findings_text import render_devices, render_findings
from memprobe.snapshot import write_snapshot

CFG = tf.Gpt()
N, V = CFG.tokens, CFG.vocab
LOGITS_BYTES = 4 * N * V


def _text(findings) -> str:
    return "\n".join(render_findings(findings))


def test_shapes_are_inferred_without_hints() -> None:
    f = attribute(tf.gpt_snapshot())
    inf = f.inference
    assert (inf.tokens, inf.vocab, inf.hidden) == (N, V, CFG.hidden)
    assert (inf.batch, inf.seq) == (CFG.batch, CFG.seq)  # attention + mask evidence
    assert inf.logits_dtype == "float32" and inf.confidence in ("medium", "high")
    family = f.logits_family
    assert len(family) == 4 and {b.size for b in family} == {LOGITS_BYTES}
    assert all(b.dtype == "float32" and b.shape == (4, 512, 10000) for b in family)
    assert {b.op for b in family} >= {"aten::mm", "aten::_log_softmax"}
    text = _text(f)
    assert "logits [B=4, S=512, V=10,000], H = 768, float32" in text


def test_hints_override_inference() -> None:
    f = attribute(tf.gpt_snapshot(), vocab=V, tokens=CFG.seq, batch=CFG.batch)
    assert f.inference.confidence == "given" and f.inference.tokens == N
    # A vocabulary the trace does not support leaves no logits reading at all.
    wrong = attribute(tf.gpt_snapshot(), vocab=V + 1)
    assert not wrong.logits_family


def test_weight_sized_blocks_never_get_a_logits_label() -> None:
    # N == H: the [V, H] weights, their gradients and Adam's state have the logits' bytes.
    cfg = tf.Gpt(batch=1, seq=768, hidden=768)
    f = attribute(tf.gpt_snapshot(cfg), top=200, min_block_bytes=1)
    same = [b for b in f.findings if b.size == 4 * cfg.tokens * cfg.vocab]
    by_category = {c: [b for b in same if b.category == c] for c in {b.category for b in same}}
    assert by_category[OPTIMIZER] and by_category[GRADIENTS] and by_category[PARAMETERS]
    for category in (OPTIMIZER, GRADIENTS, PARAMETERS):
        for b in by_category[category]:
            assert not b.logits and b.dtype is None and not b.explanations, b
    assert {b.category for b in same if b.logits} == {LOGITS}
    assert len([b for b in same if b.logits]) == 4


def test_peak_breakdown_leads_and_logits_survive_900_larger_blocks() -> None:
    cfg = tf.Gpt(extra_params=900)
    f = attribute(tf.gpt_snapshot(cfg), top=10)
    assert f.breakdown[0][0] == PARAMETERS  # 900 × 100 MiB alive before the trace
    assert sum(b for _, b in f.breakdown) == f.peak_allocated_bytes
    text = _text(f)
    first_screen = text.splitlines()[:4]
    assert any("made of: 88." in line and "parameters" in line for line in first_screen)
    assert any("during backward" in line for line in first_screen)
    assert "900 × 100.00 MiB = 87.89 GiB  parameters, alive before the trace" in text
    # Every logits-family block is listed, far below the 900 larger ones.
    assert "logits-family blocks: 4 in the trace" in text
    assert len(f.logits_family) == 4


def test_ring_buffer_that_dropped_its_oldest_entries() -> None:
    full = attribute(tf.gpt_snapshot())
    cut = attribute(tf.ring_buffer(tf.gpt_snapshot(), dropped=6))
    assert cut.peak_allocated_bytes == full.peak_allocated_bytes
    assert any("ring buffer" in n for n in cut.notes)
    assert (cut.inference.tokens, cut.inference.vocab) == (N, V)
    assert dict(cut.breakdown)[PARAMETERS] == dict(full.breakdown)[PARAMETERS]


def test_user_line_skips_libraries_and_names_them() -> None:
    f = attribute(tf.through_libraries(tf.gpt_snapshot()))
    head = next(b for b in f.logits_family if b.op == "aten::mm")
    assert head.frame == Frame("forward", tf.MODEL, 39)
    assert head.via == ("einops.einsum",)
    assert len(head.chain) <= 3 and all(x.filename in (tf.MODEL, tf.TRAIN) for x in head.chain)
    assert "(via einops.einsum)" in _text(f)
    for b in f.findings:
        assert b.frame is None or "site-packages" not in b.frame.filename


def test_backward_cpp_frames_give_nodes_and_phase() -> None:
    f = attribute(tf.gpt_snapshot())
    nodes = {b.node for b in f.logits_family if b.phase == "backward"}
    assert nodes == {"NllLossBackward0", "LogSoftmaxBackward0"}
    assert "[NllLossBackward0]" in _text(f)
    assert all(b.frame is None for b in f.logits_family if b.phase == "backward")


def test_compiled_forward_points_past_generated_code() -> None:
    f = attribute(tf.compiled(tf.gpt_snapshot()))
    head = next(b for b in f.logits_family if b.op == "aten::mm")
    assert head.frame == Frame("forward", tf.MODEL, 39)
    assert head.via == ("generated code (torch.compile)",)
    for name in (tf.GENERATED, "<eval_with_key>.3", "C:\\Temp\\torchinductor_me\\x\\c.py"):
        assert is_internal(Frame("call", name, 10)), name


def test_legacy_file_without_time_us_or_settings() -> None:
    base = attribute(tf.gpt_snapshot())
    old = attribute(tf.without_time(tf.gpt_snapshot()))
    assert old.peak_allocated_bytes == base.peak_allocated_bytes
    assert old.peak_time_us is None and old.inference == base.inference
    assert old.allocator.settings == ()
    assert "entry #" in _text(old)


def test_windows_python_only_stacks() -> None:
    f = attribute(tf.windows_python_only(tf.gpt_snapshot()))
    assert (f.inference.tokens, f.inference.vocab) == (N, V)
    ops = {b.op for b in f.logits_family}
    assert {"torch.nn.functional.linear", "torch.nn.functional.cross_entropy"} <= ops
    frameless = [b for b in f.logits_family if b.op is None]
    assert len(frameless) == 2
    assert all(b.phase == "backward" and b.phase_reason.startswith("no frames") for b in frameless)
    assert "backward (autograd engine)" in _text(f)
    head = next(b for b in f.logits_family if b.op == "torch.nn.functional.linear")
    assert head.frame == Frame("forward", "C:\\Users\\me\\gpt\\model.py", 39)


def test_cnn_has_no_logits_path() -> None:
    f = attribute(tf.cnn_snapshot(), vocab=1000)
    assert not f.inference.logits_path and not f.logits_family
    assert all(b.dtype is None and not b.explanations for b in f.findings)
    assert "no LM logits path found" in _text(f)


def test_attention_softmax_and_integer_ops_are_not_the_logits_path() -> None:
    attn = [Frame("softmax", "/home/me/m.py", 3), Frame("attention", "/home/me/m.py", 9)]
    assert loss_evidence("aten::_softmax", None, attn) is None
    assert loss_evidence("aten::one_hot", None, [Frame("cross_entropy", "/a/b.py", 1)]) is None
    assert loss_evidence("aten::_log_softmax", None, []) == "op aten::_log_softmax"


def test_every_device_oom_device_first_with_fragmentation_verdict() -> None:
    found = attribute_devices(tf.two_devices_oom_on_1())
    assert [f.device for f in found] == [1, 0]
    (oom,) = found[0].ooms
    assert oom.verdict.kind == "fragmentation"
    assert oom.verdict.free_in_reserved_bytes == 1 << 30
    assert oom.verdict.largest_free_block == 512 * tf.MiB
    text = "\n".join(render_devices(found))
    assert text.startswith("2 devices with a trace (device 1: peak")
    assert "expandable_segments:True" in text and "OOM #1 on device 1" in text
    assert [f.device for f in attribute_devices(tf.two_devices_oom_on_1(), device=0)] == [0]


def test_diff_names_the_grown_line_first(tmp_path: Path, run_cli) -> None:
    a = attribute(tf.gpt_snapshot(tf.Gpt(seq=512)))
    b = attribute(tf.gpt_snapshot(tf.Gpt(seq=1024)))
    d = diff_findings(a, b)
    deltas = [c.delta_bytes for c in d.contributors]
    assert deltas == sorted(deltas, reverse=True) and deltas[0] > 0
    first = d.contributors[0]
    assert first.frame is not None and first.frame.filename == tf.MODEL
    # Attention scores grow with S²: the attention lines lead a context-length change.
    assert first.frame.name == "attention"
    pa = write_snapshot(tf.gpt_snapshot(tf.Gpt(seq=512)), tmp_path / "a.pickle")
    pb = write_snapshot(tf.gpt_snapshot(tf.Gpt(seq=1024)), tmp_path / "b.pickle")
    code, out, err = run_cli("diff", str(pa), str(pb), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"peak_a_bytes", "peak_b_bytes", "differences", "contributors"}
    c0 = data["contributors"][0]
    assert set(c0) == {"frame", "op", "category", "bytes_a", "bytes_b", "delta_bytes"}
    assert set(c0["frame"]) == {"filename", "line", "name"}
    assert data["peak_a_bytes"] == a.peak_allocated_bytes
    assert data["differences"] == [
        {"what": "sequence", "a": 512, "b": 1024, "evidence": "each file's B, S split"}
    ]
    code, out, _ = run_cli("diff", str(pa), str(pb))
    assert code == 0 and "by category" in out and "model.py:4" in out


def test_cli_json_device_and_html(tmp_path: Path, run_cli) -> None:
    path = write_snapshot(tf.two_devices_oom_on_1(), tmp_path / "two.pickle")
    code, out, err = run_cli("attribute", str(path), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["device"] == 1 and [d["device"] for d in data["other_devices"]] == [0]
    code, out, _ = run_cli("attribute", str(path), "--device", "0", "--json")
    assert json.loads(out)["device"] == 0
    page = tmp_path / "page.html"
    gpt = write_snapshot(tf.gpt_snapshot(), tmp_path / "gpt.pickle")
    code, _, err = run_cli("attribute", str(gpt), "--html", str(page))
    assert code == 0, err
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "data:image/png;base64," in html
    assert "Logits-family blocks (4)" in html and "http:" not in html and "https:" not in html
    assert "default-src 'none'" in html  # the base page's CSP


def test_unknown_device_is_one_line(tmp_path: Path, run_cli) -> None:
    path = write_snapshot(tf.gpt_snapshot(), tmp_path / "g.pickle")
    code, out, err = run_cli("attribute", str(path), "--device", "7")
    assert code == 2 and "device 7" in err and err.count("\n") == 1
