"""Hostile inputs, round 23 (r23_files), files a user hands memprobe: snapshot pickles
whose memprobe record was edited, run directories, model config.json files and gate
configs. Each table is a variant of a defect class the pass found: one line and exit 2
that names what is wrong, or an answer whose every word the file supports."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line
from small_config import SMALL


def _snapshot(made_run: Path) -> Path:
    return next((made_run / "snapshots").glob("*.pickle"))


def _with_case(made_run: Path, to: Path, case: str | None) -> Path:
    """The run's snapshot with its recorded case id replaced (None: the key removed)."""
    snap = pickle.loads(_snapshot(made_run).read_bytes())
    if case is None:
        del snap["memprobe"]["case"]
    else:
        snap["memprobe"]["case"] = case
    to.write_bytes(pickle.dumps(snap, protocol=4))
    return to


def _shapes_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("shapes:"))


# -- a snapshot whose recorded case id gives a size of 0 (an edited or hand-made file:
# memprobe never runs such a case), or a shard of nothing (V < tp, S < cp): its sizes were
# taken as the record's B, S, V, and attribute, diff, --what-if and plan --other-from all
# ended in a traceback ("ZeroDivisionError: integer modulo by zero"). Such an id is no
# record: the file reads as one that records no case.

ZERO_SIZED = {
    "batch 0": "unchunked-b0-s64-v128-bf16-cnone-tp1-cp1-meta-00000000",
    "tokens 0": "unchunked-b1-s0-v128-bf16-cnone-tp1-cp1-meta-00000000",
    "vocab 0": "unchunked-b1-s64-v0-bf16-cnone-tp1-cp1-meta-00000000",
    "a vocab smaller than tp": "unchunked-b1-s64-v1-bf16-cnone-tp2-cp1-meta-00000000",
    "tokens fewer than cp": "unchunked-b1-s1-v128-bf16-cnone-tp1-cp2-meta-00000000",
    "hidden 0": "fused_linear_chunked-h0-b1-s64-v128-bf16-c32-tp1-cp1-meta-00000000",
}


@pytest.mark.parametrize("what", sorted(ZERO_SIZED))
def test_a_zero_sized_recorded_case_reads_as_no_record(
    run_cli: Any, made_run: Path, tmp_path: Path, what: str
) -> None:
    edited = _with_case(made_run, tmp_path / "edited.pickle", ZERO_SIZED[what])
    plain = _with_case(made_run, tmp_path / "plain.pickle", None)
    code, out, err = run_cli("attribute", str(edited))
    assert code == 0 and "Traceback" not in err, err
    assert _shapes_line(out) == _shapes_line(run_cli("attribute", str(plain))[1])


@pytest.mark.parametrize(
    "command",
    [
        ["attribute", "{s}", "--what-if", "local_chunked"],
        ["diff", "{s}", "{s}"],
        ["plan", "--other-from", "{s}", "--budget", "1GiB", "--vocab", "128"],
    ],
    ids=["what-if", "diff", "plan --other-from"],
)
def test_a_zero_sized_recorded_case_is_no_traceback(
    run_cli: Any, made_run: Path, tmp_path: Path, command: list[str]
) -> None:
    edited = _with_case(made_run, tmp_path / "edited.pickle", ZERO_SIZED["tokens 0"])
    code, out, err = run_cli(*(a.format(s=edited) for a in command))
    assert "Traceback" not in err and "ZeroDivisionError" not in err, err
    if code:
        one_line(code, out, err)


# -- a config.json whose weights are too large for torch to size at all (hidden_size
# 2^40 makes a q_proj of 2^80 elements; vocab × hidden past int64): `step` said "the step
# failed on meta ... check the config's sizes", but `plan --step` builds the model once
# untracked first (for a table of learned positions) and ended in a traceback
# ("RuntimeError: Storage size calculation overflowed"). Both now say it in one line.

OVERFLOWING = {
    "hidden_size 2^40": {"hidden_size": 2**40},
    "hidden_size and intermediate_size 2^32": {"hidden_size": 2**32, "intermediate_size": 2**32},
    "vocab_size 2^40 at hidden_size 2^24": {"vocab_size": 2**40, "hidden_size": 2**24},
}


@pytest.mark.parametrize("command", ["step", "plan --step"])
@pytest.mark.parametrize("what", sorted(OVERFLOWING))
def test_a_config_whose_weights_overflow_torch_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, **OVERFLOWING[what]}))
    args = {
        "step": ["step", "--config", str(tmp_path), "--tokens", "16"],
        "plan --step": ["plan", "--step", "--config", str(tmp_path), "--budget", "1GiB"],
    }[command]
    err = one_line(*run_cli(*args))
    assert "overflowed" in err and "check the config's sizes" in err, err


# -- a run whose page or plot is a link out of it (dangling, or to another run's page, as
# a run tracked by DVC or copied with `cp -s` holds): `report RUN` and a resume's page
# went through the link, wrote the page or PNG where it pointed, and made the folders the
# link named (a report.html -> /somewhere/new/x.html made /somewhere/new). Results files
# and snapshots linked out were refused on resume (rounds 21, 22); the page and plots
# written into the run are now held to the same rule. --out names its place: unchanged.


def _link_out(run: Path, name: str, to: Path) -> Path:
    (run / name).unlink(missing_ok=True)
    (run / name).symlink_to(to)
    return to


LINKS_OUT = {
    "report.html, dangling into a folder not there": ("report.html", "gone/x.html"),
    "report.html, to another run's page": ("report.html", "other/report.html"),
    "timeline.png, dangling": ("timeline.png", "elsewhere.png"),
    "peak_breakdown.png, to another run's plot": ("peak_breakdown.png", "other/peak_breakdown.png"),
}


@pytest.mark.parametrize("what", sorted(LINKS_OUT))
def test_the_runs_page_is_never_written_through_a_link_out_of_it(
    run_cli: Any, made_run: Path, tmp_path: Path, what: str
) -> None:
    name, where = LINKS_OUT[what]
    other = shutil.copytree(made_run, tmp_path / "other")
    run = shutil.copytree(made_run, tmp_path / "run")
    target = _link_out(run, name, tmp_path / where)
    before = target.read_bytes() if target.exists() else None
    err = one_line(*run_cli("report", str(run)))
    assert f"{run / name} is a link" in err and "leads out of the run" in err, err
    assert (target.read_bytes() if target.exists() else None) == before
    assert not (tmp_path / "gone").exists() and (other / "report.html").exists()


def test_a_resume_refuses_a_page_linked_out_before_any_case(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = shutil.copytree(made_run, tmp_path / "run")
    payload = json.loads((run / "results.json").read_text())
    payload["rows"] = payload["rows"][:-1]
    (run / "results.json").write_text(json.dumps(payload))
    before = (run / "results.json").read_bytes()
    _link_out(run, "report.html", tmp_path / "gone" / "x.html")
    err = one_line(*run_cli("sweep", "--resume", str(run), "-q", "--no-verify"))
    assert "leads out of the run" in err and "--no-report" in err, err
    assert (run / "results.json").read_bytes() == before and not (tmp_path / "gone").exists()


def test_a_page_linked_inside_the_run_or_an_out_page_is_written(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = shutil.copytree(made_run, tmp_path / "run")
    _link_out(run, "report.html", Path("page.v2.html"))
    code, out, err = run_cli("report", str(run))
    assert code == 0 and (run / "page.v2.html").is_file(), err
    _link_out(run, "report.html", tmp_path / "gone" / "x.html")
    code, out, err = run_cli("report", str(run), "--out", str(tmp_path / "mine.html"))
    assert code == 0 and (tmp_path / "mine.html").is_file(), err


# -- a config.json number past a float's range (1e400): json reads it as infinity, the
# very value refused when spelled Infinity ("holds Infinity, which JSON does not allow"),
# and the model was built with a rope_theta (or an eps, a scaling factor) of inf, exit 0.

PAST_FLOAT = {
    "rope_theta 1e400": ("rope_theta", "1e400"),
    "rms_norm_eps -1E999": ("rms_norm_eps", "-1E999"),
    "a rope_scaling factor 2e308": ("rope_scaling", '{"rope_type": "linear", "factor": 2e308}'),
}


@pytest.mark.parametrize("command", ["step", "plan --step"])
@pytest.mark.parametrize("what", sorted(PAST_FLOAT))
def test_a_config_number_past_a_floats_range_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    key, raw = PAST_FLOAT[what]
    (tmp_path / "config.json").write_text(json.dumps(SMALL)[:-1] + f', "{key}": {raw}}}')
    args = {
        "step": ["step", "--config", str(tmp_path), "--tokens", "16"],
        "plan --step": ["plan", "--step", "--config", str(tmp_path), "--budget", "1GiB"],
    }[command]
    err = one_line(*run_cli(*args))
    assert "past a float's range" in err and "config.json" in err, err


def test_a_config_with_large_finite_numbers_is_built(run_cli: Any, tmp_path: Path) -> None:
    config = {**SMALL, "rope_theta": 1e300, "rms_norm_eps": 1e-320}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = run_cli("step", "--config", str(tmp_path), "--tokens", "16")
    assert code == 0 and "llama" in out, err


# -- plan --from-run of a run with times but none it can use: every timed row failed
# (status error or oom, its times what ran before the failure) or timed forward alone. A
# run without any time was refused ("has no measured times"); these passed that check,
# the chunk choice then read no row (it reads only rows that finished ok with both
# times), and the plan ran as if --from-run were not given, without a word.


def _timed_run(made_run: Path, to: Path) -> Path:
    """The made (meta) run, its rows given the times a cpu run writes."""
    run = shutil.copytree(made_run, to)
    payload = json.loads((run / "results.json").read_text())
    for row in payload["rows"]:
        row.update(device="cpu", fwd_time_s=0.01, bwd_time_s=0.02)
    (run / "results.json").write_text(json.dumps(payload))
    return run


UNUSABLE_TIMES = {
    "every timed row an error": {"status": "error", "note": "boom"},
    "every timed row an oom": {"status": "oom", "note": "CUDA out of memory"},
    "forward timed, backward not": {"bwd_time_s": None},
}


@pytest.mark.parametrize("what", sorted(UNUSABLE_TIMES))
def test_from_run_without_a_usable_time_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path, what: str
) -> None:
    run = _timed_run(made_run, tmp_path / "run")
    payload = json.loads((run / "results.json").read_text())
    for row in payload["rows"]:
        row.update(UNUSABLE_TIMES[what])
    (run / "results.json").write_text(json.dumps(payload))
    args = ["plan", "--from-run", str(run), "--budget", "1MiB", "--vocab", "128"]
    err = one_line(*run_cli(*args, "--kernel", "local_chunked", "--no-reserved"))
    assert "has no measured times" in err and "drop --from-run" in err, err


def test_from_run_with_one_usable_time_plans(run_cli: Any, made_run: Path, tmp_path: Path) -> None:
    run = _timed_run(made_run, tmp_path / "run")
    args = ["plan", "--from-run", str(run), "--budget", "1MiB", "--vocab", "128"]
    code, out, err = run_cli(*args, "--kernel", "local_chunked", "--no-reserved")
    assert code == 0 and "local_chunked" in out, err
