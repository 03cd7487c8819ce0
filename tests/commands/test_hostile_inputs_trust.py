"""Hostile inputs, table-driven: outputs that would destroy inputs, injected control
characters and markup, user code imported where it should not be, odd size parameters,
tampered snapshot contents and run directories, sizes past any GPU. One line, exit 2,
or inert output."""

from __future__ import annotations

import copy
import json
import pickle
import re
import shutil
import sys
from pathlib import Path

import pytest
import snapshot_fixtures as fx

from memprobe.errors import UserError
from memprobe.io.files import guard_outputs
from memprobe.io.text import printable

RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


@pytest.fixture
def run(made_run: Path, tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1GiB" }]\n'
    )
    return Path(shutil.copytree(made_run, tmp_path / "run"))


# -- outputs never replace inputs, nor each other ---------------------------------

DESTROYERS = {
    "junit onto the config": ["gate", "{run}", "--junit-xml", "pyproject.toml"],
    "junit onto an explicit config": [
        "gate",
        "{run}",
        "--config",
        "pyproject.toml",
        "--junit-xml",
        "./pyproject.toml",
    ],  # fmt: skip
    "baseline onto run.json": ["gate", "{run}", "--update-baseline", "{run}/run.json"],
    "baseline onto results.json": ["gate", "{run}", "--update-baseline", "{run}/results.json"],
    "baseline onto the config": ["gate", "{run}", "--update-baseline", "pyproject.toml"],
    "baseline inside the run": ["gate", "{run}", "--update-baseline", "{run}/snapshots/b.json"],
    "junit = baseline": ["gate", "{run}", "--junit-xml", "x.xml", "--update-baseline", "./x.xml"],
    "junit onto the baseline": [
        "gate",
        "{run}",
        "--baseline",
        "{run}",
        "--junit-xml",
        "{run}/results.json",
    ],  # fmt: skip
}


@pytest.mark.parametrize("name", sorted(DESTROYERS))
def test_no_output_replaces_an_input_or_another_output(run_cli, run: Path, name: str) -> None:
    before = {p: p.read_bytes() for p in [*run.iterdir(), Path("pyproject.toml")] if p.is_file()}
    args = [a.replace("{run}", str(run)) for a in DESTROYERS[name]]
    code, _, err = run_cli(*args)
    assert code == 2, err
    assert "an input of this command" in err or "one would silently replace" in err
    assert {p: p.read_bytes() for p in before} == before
    assert not Path("x.xml").exists()


def test_update_baseline_may_rewrite_the_baseline_it_read(run_cli, run: Path) -> None:
    shutil.copy(run / "results.json", "base.json")
    code, out, err = run_cli("gate", str(run), "--baseline", "base.json", "--update-baseline",
                             "base.json")  # fmt: skip
    assert code == 0, err


@pytest.mark.parametrize(
    ("outputs", "inputs"),
    [
        ({"--a": "x", "--b": "./x"}, []),
        ({"--a": "d/../x", "--b": "x"}, []),
        ({"--a": "in/deep/x"}, ["in"]),
        ({"--a": "f"}, ["f"]),
    ],
)
def test_guard_outputs(tmp_path: Path, monkeypatch, outputs: dict, inputs: list) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "d").mkdir()
    with pytest.raises(UserError):
        guard_outputs(outputs, [Path(i) for i in inputs])


@pytest.mark.parametrize("name", ["report.html", "timeline.png", "peak_breakdown.png"])
def test_report_leaves_a_users_own_files_alone(run_cli, run: Path, name: str) -> None:
    pages = Path("pages")
    pages.mkdir()
    mine = pages / name
    mine.write_bytes(b"my own " + name.encode())
    code, _, err = run_cli("report", str(run), "--out", "pages/")
    assert code == 2 and "was not written by memprobe" in err
    assert mine.read_bytes() == b"my own " + name.encode()
    assert sorted(p.name for p in pages.iterdir()) == [name]  # nothing half-written


def test_report_replaces_its_own_page(run_cli, run: Path) -> None:
    Path("pages").mkdir()
    for _ in range(2):
        code, _, err = run_cli("report", str(run), "--out", "pages/")
        assert code == 0, err


# -- injection: control characters and markup from tampered files ------------------

EVIL = [
    "x\x1b]0;pwned\x07",
    "ok\r\nFAKE: all checks passed",
    "nul\x00byte",
    "lone\ud800surrogate",
    "csi\x1b[2J\x1b[Hclear",
    "c1\x9bcsi",
    "sep\u2028line",
]


@pytest.mark.parametrize("text", EVIL)
def test_printable_leaves_no_control_character(text: str) -> None:
    shown = printable(text)
    assert not RAW_CONTROL.search(shown) and shown.isprintable()
    assert printable(shown) == shown  # idempotent on what it made


def _snapshot_with(tmp_path: Path, field: str, value: str) -> Path:
    snap = copy.deepcopy(fx.real_style_snapshot())
    for e in snap["device_traces"][0]:
        if field == "user_metadata":
            e["user_metadata"] = f"memprobe op={value} phase=forward"
        for f in e.get("frames", []):
            f[field] = value
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return path


@pytest.mark.parametrize("field", ["name", "filename", "user_metadata"])
@pytest.mark.parametrize("text", EVIL[:4])
def test_snapshot_text_prints_inert(run_cli, tmp_path: Path, field: str, text: str) -> None:
    path = _snapshot_with(tmp_path, field, text)
    for args in (["attribute", str(path)], ["diff", str(path), str(path)]):
        code, out, err = run_cli(*args)
        assert code == 0, err
        assert not RAW_CONTROL.search(out + err)
        assert "FAKE: all checks passed" not in out.splitlines()


@pytest.mark.parametrize("column", ["kernel", "dtype", "device"])
@pytest.mark.parametrize("text", EVIL[:4])
def test_a_tampered_identity_is_refused(run_cli, run: Path, column: str, text: str) -> None:
    data = json.loads((run / "results.json").read_text())
    data["rows"][0][column] = text
    (run / "results.json").write_text(json.dumps(data))
    code, out, err = run_cli("gate", str(run))
    assert code == 2 and not RAW_CONTROL.search(out + err)
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text", EVIL)
def test_a_tampered_note_prints_inert(run_cli, run: Path, text: str) -> None:
    data = json.loads((run / "results.json").read_text())
    data["rows"][0]["note"] = text
    (run / "results.json").write_text(json.dumps(data))
    # A copy: the run itself as its own baseline is refused (it compares nothing).
    Path("base.json").write_text(json.dumps(data))
    code, out, err = run_cli("gate", str(run), "--baseline", "base.json", "--junit-xml", "j.xml")
    assert code == 0, err
    assert not RAW_CONTROL.search(out + err + Path("j.xml").read_text())


@pytest.mark.parametrize(
    "kernel", ["k`![x](https://e.example/t.png)`", "``", "a|b", "**bold**", "<img src=x>"]
)
def test_step_summary_code_spans_hold(kernel: str) -> None:
    from memprobe.gate import Check, Verdict
    from memprobe.render.markdown import markdown_summary

    check = Check("rules[0]", "status", kernel, f"{kernel}-b1", passed=False, reason=kernel)
    text = markdown_summary(Verdict((check,), "r`un", 1))
    row = text.splitlines()[-3]
    # Outside the code spans no markup survives: no image, link, bold or HTML tag.
    outside = re.sub(r"(`+) .*? \1|(`+)[^`]+?\2", "", row)
    assert not re.search(r"(?<!\\)!\[|(?<!\\)\*\*|(?<!\\)<img", outside), row


def test_attribute_page_has_a_csp(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(fx.real_style_snapshot(), protocol=4))
    assert run_cli("attribute", str(path), "--html", str(tmp_path / "a.html"))[0] == 0
    assert "Content-Security-Policy" in (tmp_path / "a.html").read_text()


# -- user code: imported only to run it, and sys.path restored ----------------------


def test_gate_on_results_imports_no_user_kernel(run_cli, run: Path) -> None:
    Path("evilmod.py").write_text("open('imported', 'w').write('ran')\ndef fn(*a, **k): pass\n")
    Path("pyproject.toml").write_text(
        '[tool.memprobe.sweep]\ntokens = [64]\nvocab = [128]\nkernel = ["evilmod:fn"]\n'
        '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1GiB" }]\n'
    )
    code, _, err = run_cli("gate", str(run))
    assert code == 0, err
    assert not Path("imported").exists()


def test_importing_a_user_kernel_restores_sys_path(tmp_path: Path, monkeypatch) -> None:
    from memprobe.kernels.user import import_callable

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    (tmp_path / "mykern_restore.py").write_text("def fn(logits, targets):\n    return logits\n")
    before = list(sys.path)
    fn = import_callable("mykern_restore:fn", what="--kernel", hint="")
    assert callable(fn) and sys.path == before


@pytest.mark.parametrize(
    ("name", "param"),
    [("local_tiled", "tile_size"), ("filtered", "top_k"), ("unchunked", "chunk_size")],
)
@pytest.mark.parametrize("bad", [2.5, "8", True, 0, -3])
def test_size_parameters_are_refused_alike(name: str, param: str, bad: object) -> None:
    import torch

    from memprobe.kernels import get_kernel

    logits, targets = torch.zeros(1, 4, 8), torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=f"{param} must be a positive integer or None"):
        get_kernel(name)(logits, targets, **{param: bad})


@pytest.mark.parametrize("bad", [2.5, "5"])
def test_next_token_logprobs_refuses_a_float_top_k(bad: object) -> None:
    import torch

    from memprobe.kernels import next_token_logprobs

    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        next_token_logprobs(torch.zeros(1, 4, 8), torch.zeros(1, 4, dtype=torch.long), top_k=bad)


def test_fused_linear_refuses_a_float_tile(tmp_path: Path) -> None:
    import torch

    from memprobe.kernels import get_kernel

    hidden, weight = torch.zeros(1, 4, 8), torch.zeros(16, 8)
    with pytest.raises(ValueError, match="tile_size must be a positive integer"):
        get_kernel("fused_linear_chunked")(hidden, weight, torch.zeros(1, 4, dtype=torch.long),
                                           tile_size=2.5)  # fmt: skip


@pytest.mark.parametrize("limit", [10**400, "9" * 400, "9" * 400 + " GiB", float("inf")])
def test_the_pytest_marker_refuses_an_impossible_limit(limit: object) -> None:
    from memprobe.commands.pytest_plugin import parse_marker

    with pytest.raises(UserError):
        parse_marker((limit,), {})
