"""Hostile inputs, round 27 (files): every file a user hands memprobe and the flags that go
with it, tried two at a time — two files each valid alone that disagree (snapshots of two
jobs given as one), numbers each valid alone that contradict each other, and paths the
file system takes that memprobe's own handling did not. Each table is a variant of a
defect class the pass found: one line and exit 2 that names what is wrong, or an answer
whose every word the files support."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, profiled

# A profiled LM step at T tokens with X extra [256, 32] weights beside its lm_head: X sets
# what "the rest of the job" holds, T the activations that grow with the tokens.
STEP = """\
import torch
import torch.nn.functional as F
def step(device):
    w = torch.randn(256, 32, device=device, requires_grad=True)
    extra = [torch.randn(256, 32, device=device, requires_grad=True) for _ in range({x})]
    h = torch.randn(1, {t}, 32, device=device)
    ids = torch.randint(0, 256, (1, {t}), device=device)
    logits = h @ w.t()
    F.cross_entropy(logits.float().view(-1, 256), ids.view(-1)).backward()
"""

# (tokens, extra weights) of each profiled step: "big" and "small" are two models.
STEPS = {"big64": (64, 8), "big128": (128, 8), "big192": (192, 8), "small128": (128, 0),
         "small192": (192, 0), "mid96": (96, 6)}  # fmt: skip


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    here = tmp_path_factory.mktemp("r27_steps")
    return {
        name: profiled(here, f"r27_{name}", STEP.format(t=tokens, x=extra), name)
        for name, (tokens, extra) in STEPS.items()
    }


PLAN = ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "local_chunked", "--no-reserved"]

# -- O1: plan --other-from snapshots of two jobs whose "other" falls as tokens grow (a
# bigger model profiled at fewer tokens). The least-squares line had a negative per-token
# part and the plan took it: "other 833.49 KiB (+ -722 B per token)", and at the answer
# other was clamped to 0 B (the bigger model's weights gone), 5,646 tokens where 3,674
# fit; with a steeper fall the kernel was blamed ("the peak stops growing with tokens
# beyond 1,099,511,627,776"). It is one line naming each reading.

FALLING = {
    "bigger model at fewer tokens": ["big64", "small128"],
    "bigger model at fewer tokens, given second": ["small192", "big128"],
    "three readings, the line falls": ["big64", "small128", "small192"],
    "a mid-size model beside a small one": ["mid96", "small192"],
}


@pytest.mark.parametrize("names", list(FALLING.values()), ids=list(FALLING))
def test_other_that_falls_with_tokens_is_one_line(
    run_cli: Any, steps: dict[str, Path], names: list[str]
) -> None:
    paths = ",".join(str(steps[n]) for n in names)
    err = one_line(*run_cli(*PLAN, "--other-from", paths))
    assert "--other-from: the rest of the job holds less at more tokens (" in err, err
    assert "not one job at different token counts" in err and "stops growing" not in err


@pytest.mark.parametrize("names", [["big64", "big128"], ["big64", "big128", "big192"],
                                   ["small128", "small192"], ["big128", "small128"]])  # fmt: skip
def test_other_of_one_job_at_several_token_counts_still_plans(
    run_cli: Any, steps: dict[str, Path], names: list[str]
) -> None:
    """One model at growing counts fits a line that grows; two models at one count are
    planned on the larger, as before."""
    code, out, err = run_cli(*PLAN, "--other-from", ",".join(str(steps[n]) for n in names))
    assert code == 0 and "other: " in out and "-" not in out.split("other: ")[-1][:20], err


# -- P1: a current directory deeper than PATH_MAX (4,096 bytes; a CI checkout nested in
# long job folders): every file memprobe wrote there through its atomic write was refused,
# "cannot write run/peak_breakdown.png: File name too long", a path of 22 characters the
# file system takes (tempfile.mkstemp names its file by an absolute path). Written now.


@pytest.fixture
def deep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A current directory whose absolute path is longer than PATH_MAX, entered one folder
    at a time (no absolute path reaches it); monkeypatch returns to the first one after."""
    import os

    monkeypatch.chdir(tmp_path)
    for _ in range(22):
        os.mkdir("d" * 200)
        os.chdir("d" * 200)
    assert len(os.getcwd()) > 4096
    return Path(".")


@pytest.mark.parametrize("name", ["out.txt", "sub/out.txt", "./out.txt", "a/b/../out.txt"])
def test_a_file_is_written_in_a_folder_deeper_than_path_max(deep: Path, name: str) -> None:
    import os

    from memprobe.io.files import write_atomic

    write_atomic(name, "whole\n")
    assert Path(name).read_text() == "whole\n"
    assert not [f for f in os.listdir(Path(name).parent) if f.endswith(".tmp")]
    write_atomic(name, b"again")  # replaced, not refused as existing
    assert Path(name).read_bytes() == b"again"


def test_gate_writes_its_outputs_deeper_than_path_max(
    run_cli: Any, made_run: Path, deep: Path
) -> None:
    import shutil

    shutil.copytree(made_run, "run")
    Path("g.toml").write_text('[tool.memprobe.gate]\nrules = [{kernel="*", max_peak="1TiB"}]\n')
    code, out, err = run_cli(
        "gate", "run", "--config", "g.toml", "--junit-xml", "j.xml", "--update-baseline", "b.json"
    )
    assert code == 0 and not err, err
    assert Path("j.xml").read_text().startswith("<?xml") and '"rows"' in Path("b.json").read_text()


# -- G1: a config's max_regression with no baseline anywhere (neither `baseline =` in
# [tool.memprobe.gate] nor --baseline): the gate passed on its rules alone, "passed: all
# 2 check(s)", with no word that the growth it allows was never checked (--max-regression
# typed without a baseline is refused). A note says so; the verdict stands.

RULE = 'rules = [{kernel="*", max_peak="1TiB"}]\n'


@pytest.mark.parametrize("allowed", ["5", "0.5", "100", "1e-3"])
def test_a_configs_max_regression_without_a_baseline_is_said(
    run_cli: Any, made_run: Path, tmp_path: Path, allowed: str
) -> None:
    config = tmp_path / "g.toml"
    config.write_text(f"[tool.memprobe.gate]\nmax_regression = {allowed}\n{RULE}")
    code, out, err = run_cli("gate", str(made_run), "--config", str(config))
    assert code == 0 and not err, err
    note = f"note: max_regression {float(allowed):g}% ({config}) not applied: no baseline"
    assert note in out and out.rstrip().endswith("check(s)"), out


@pytest.mark.parametrize("how", ["--baseline", "config baseline", "max_regression 0"])
def test_a_configs_max_regression_with_a_baseline_is_applied(
    run_cli: Any, made_run: Path, tmp_path: Path, how: str
) -> None:
    import shutil

    base = tmp_path / "base.json"
    shutil.copy(made_run / "results.json", base)
    gate = f"[tool.memprobe.gate]\nmax_regression = {0 if how == 'max_regression 0' else 5}\n"
    gate += 'baseline = "base.json"\n' if how == "config baseline" else ""
    (tmp_path / "g.toml").write_text(gate + RULE)
    extra = ["--baseline", str(base)] if how == "--baseline" else []
    code, out, err = run_cli("gate", str(made_run), "--config", str(tmp_path / "g.toml"), *extra)
    assert code == 0 and "not applied" not in out, (out, err)
    assert ("max regression 5%" in out) == (how != "max_regression 0"), out


# -- V1: --vocab against the V that memprobe recorded for the snapshot's case (a sweep's
# snapshot names its case): taken as given, `attribute CASE.pickle --vocab 256` on a
# V=128 case read its float32 [64, 128] loss blocks as bfloat16 [64, 256] logits, and
# --vocab 64 its logits as five [V, H] weights ("embedding / lm_head weight"), each
# "confidence given"; --tokens/--batch against the record were already refused.


def _case_snapshot(made_run: Path) -> str:
    return str(next((made_run / "snapshots").glob("unchunked-*.pickle")))


WITH = [[], ["--json"], ["--what-if", "local_chunked"], ["--tokens", "64"]]


@pytest.mark.parametrize("vocab", ["256", "64", "100", "1", "129"])
@pytest.mark.parametrize("more", WITH)
def test_a_vocab_against_the_record_is_one_line(
    run_cli: Any, made_run: Path, vocab: str, more: list[str]
) -> None:
    err = one_line(*run_cli("attribute", _case_snapshot(made_run), "--vocab", vocab, *more))
    assert f"--vocab {vocab}, but this snapshot's case has V=128 (memprobe recorded it)" in err


def test_the_records_own_vocab_is_still_read(run_cli: Any, made_run: Path) -> None:
    code, out, err = run_cli("attribute", _case_snapshot(made_run), "--vocab", "128", "--top", "1")
    assert code == 0 and "logits [B=1, S=64, V=128]" in out, err


# -- R1: a run whose run.json planned a kernel at the page's size that has no row (an
# interrupted sweep, before --resume): the page led with "Lowest peak: unchunked, 112.25
# KiB (the reference)" as the answer, and only the metadata at its end said "1 finished
# of 2 planned". The headline now names what did not finish.


def _planned(made_run: Path, tmp_path: Path, *extra: dict[str, Any]) -> Path:
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    meta = json.loads((run / "run.json").read_text())
    meta["cases"] += [{**meta["cases"][0], **change} for change in extra]
    (run / "run.json").write_text(json.dumps(meta))
    return run


def _page_text(run: Path) -> str:
    import html
    import re

    page = (run / "report.html").read_text()
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


UNFINISHED = {
    "one kernel": ([{"kernel": "local_chunked"}], "local_chunked"),
    "two kernels": (
        [{"kernel": "local_chunked"}, {"kernel": "naive_chunked"}],
        "local_chunked, naive_chunked",
    ),
    "a kernel at two chunk sizes": (
        [{"kernel": "local_chunked", "chunk_size": 16}, {"kernel": "local_chunked"}],
        "local_chunked",
    ),
}


def _answer(run: Path) -> str:
    """The headline's sentences, as the page and the sweep's summary print them."""
    from memprobe.report.headline import make_headlines, recommendation
    from memprobe.report.page import read_run

    frame, meta = read_run(run)
    return " ".join(recommendation(make_headlines(frame, meta)[0]))


@pytest.mark.parametrize(("extra", "named"), list(UNFINISHED.values()), ids=list(UNFINISHED))
def test_a_kernel_planned_at_the_pages_size_without_a_row_is_named(
    made_run: Path, tmp_path: Path, extra: list[dict[str, Any]], named: str
) -> None:
    answer = _answer(_planned(made_run, tmp_path, *extra))
    said = f"Not finished at this size: {named} (planned, no result; finish the run with"
    assert said in answer and answer.startswith("Lowest peak: unchunked"), answer


@pytest.mark.parametrize(
    "extra",
    [[], [{"kernel": "local_chunked", "tokens": 128}], [{"kernel": "unchunked", "chunk_size": 16}]],
    ids=["complete", "at another size", "the same kernel at another chunk size"],
)
def test_a_run_whose_kernels_finished_at_the_pages_size_says_nothing_more(
    made_run: Path, tmp_path: Path, extra: list[dict[str, Any]]
) -> None:
    assert "Not finished" not in _answer(_planned(made_run, tmp_path, *extra))


def test_the_page_of_an_interrupted_run_says_what_did_not_finish(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = _planned(made_run, tmp_path, {"kernel": "local_chunked"})
    code, out, err = run_cli("report", str(run))
    assert code == 0, err
    assert "Not finished at this size: local_chunked (planned, no result;" in _page_text(run)


# -- K1: the gate's own sweep into an --out that is already a run (a CI job re-run into
# its fixed folder): refused in the sweep command's words, "choose another --out, or
# continue it with --resume g1", a flag the gate does not have (followed, it was "No such
# option: --resume"). The gate's line offers what the gate and the sweep do take.

SWEPT = (
    "[tool.memprobe.sweep]\ntokens = [64]\nvocab = [128]\nkernel = ['unchunked']\ndevice = 'meta'\n"
)


@pytest.mark.parametrize("what", ["a run", "a run's results.json gone", "a folder of notes"])
def test_a_gates_out_that_is_taken_is_refused_in_the_gates_words(
    run_cli: Any, made_run: Path, tmp_path: Path, what: str
) -> None:
    import shutil

    out = tmp_path / "taken"
    if what == "a folder of notes":
        out.mkdir()
        (out / "notes.txt").write_text("mine\n")
    else:
        shutil.copytree(made_run, out)
        if what != "a run":
            (out / "results.json").unlink()
    config = tmp_path / "g.toml"
    config.write_text(SWEPT + "[tool.memprobe.gate]\n" + RULE)
    line = one_line(*run_cli("gate", "--config", str(config), "--out", str(out)))
    assert f"--out {out} already exists and is not empty" in line
    assert "--resume" not in line.replace("memprobe sweep --resume", "")
    assert (f"`memprobe gate {out}`" in line) == (what != "a folder of notes"), line


# -- X1: a snapshot whose settings text asks for expandable segments and whose allocator
# recorded running without them: torch keeps "expandable_segments:True" in
# PYTORCH_CUDA_ALLOC_CONF where the platform has none (Windows, ROCm builds), warns
# "expandable_segments not supported on this platform", and writes expandable_segments
# False. memprobe read the text: --replay and --what-if modelled segments the job never
# had, and a fragmentation OOM was told "expandable segments are already on".

MIB = 1 << 20
ADDR = 0x7F00_0000_0000


def _fragmented(tmp_path: Path, settings: dict[str, Any]) -> str:
    """A 20 MiB segment holding 12 MiB in two live blocks, 8 MiB free in two 4 MiB
    blocks, and a failed 6 MiB request: fragmentation."""
    import pickle

    frames = [{"filename": "train.py", "line": 7, "name": "step"}]

    def entry(action: str, offset: int, size: int, **more: Any) -> dict[str, Any]:
        return {"action": action, "addr": ADDR + offset * MIB, "size": size * MIB,
                "stream": 0, "frames": frames, **more}  # fmt: skip

    trace = [entry("segment_alloc", 0, 20)] + [entry("alloc", o, s) for o, s in
             ((0, 8), (8, 4), (12, 4), (16, 4))]  # fmt: skip
    for offset in (8, 16):
        trace += [entry("free_requested", offset, 4), entry("free_completed", offset, 4)]
    trace.append(entry("oom", 0, 6, device_free=0) | {"addr": 0})
    blocks = [
        {"address": ADDR + o * MIB, "size": s * MIB, "requested_size": s * MIB * live,
         "state": "active_allocated" if live else "inactive", "frames": frames}
        for o, s, live in ((0, 8, 1), (8, 4, 0), (12, 4, 1), (16, 4, 0))
    ]  # fmt: skip
    segment = {
        "device": 0, "address": ADDR, "total_size": 20 * MIB, "allocated_size": 12 * MIB,
        "active_size": 12 * MIB, "requested_size": 12 * MIB, "stream": 0,
        "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
        "frames": frames, "blocks": blocks,
    }  # fmt: skip
    path = tmp_path / "oom.pickle"
    snapshot = {"segments": [segment], "device_traces": [trace], "allocator_settings": settings}
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    return str(path)


ASKED = "expandable_segments:True"
SETTINGS = {  # settings -> (expandable segments modelled, the verdict's advice)
    "asked, not run": ({"PYTORCH_CUDA_ALLOC_CONF": ASKED, "expandable_segments": False},
                       False, "were asked for but not run"),
    "asked under the new name, not run": (
        {"PYTORCH_ALLOC_CONF": f"max_split_size_mb:20,{ASKED}", "expandable_segments": False},
        False, "were asked for but not run"),
    "asked and run": ({"PYTORCH_CUDA_ALLOC_CONF": ASKED, "expandable_segments": True},
                      True, "are already on"),
    "asked, no field (an older torch)": ({"PYTORCH_CUDA_ALLOC_CONF": ASKED},
                                         True, "are already on"),
    "not asked": ({"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False},
                  False, "try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
}  # fmt: skip


@pytest.mark.parametrize("what", list(SETTINGS))
def test_expandable_segments_are_what_the_allocator_ran(
    run_cli: Any, tmp_path: Path, what: str
) -> None:
    from memprobe.allocator import conf_from_snapshot

    settings, modelled, advice = SETTINGS[what]
    assert conf_from_snapshot({"allocator_settings": settings}).expandable_segments is modelled
    snapshot = _fragmented(tmp_path, settings)
    code, out, err = run_cli("attribute", snapshot, "--replay", "--top", "1")
    assert code == 0, err
    verdict = next(line for line in out.splitlines() if "verdict:" in line)
    assert "verdict: fragmentation" in verdict and advice in verdict, verdict
    replay = next(line for line in out.splitlines() if line.startswith("replay on"))
    assert (ASKED in replay) is modelled, replay


# -- D2: a TOML date or time where a size, count, ratio or name was meant (TOML parses
# `max_peak = 1979-05-27` as a date): refused in Python's words, "max_peak
# datetime.date(1979, 5, 27) is not a size", "unknown device datetime.datetime(1979, 5,
# 27, 7, 32, tzinfo=datetime.tim...", and a count as "'1979-05-27'", a string the user
# never wrote. Each is shown as the file spells it.

TOML_TIMES = {
    "max_peak = 1979-05-27": "max_peak 1979-05-27 is not a size",
    "max_peak = 07:32:00": "max_peak 07:32:00 is not a size",
    'max_peak = "1TiB", max_peak_over_floor = 07:32:00': "max_peak_over_floor 07:32:00 is not",
    'max_peak = "1TiB", tokens = 1979-05-27': "'tokens' value 1979-05-27 is not a positive",
    'max_peak = "1TiB", dtype = 07:32:00.5': "unknown dtype 07:32:00.500000",
    'max_peak = "1TiB", device = 1979-05-27T07:32:00Z': "unknown device 1979-05-27T07:32:00+00:00",
    "max_big_fp32_blocks = 1979-05-27": "max_big_fp32_blocks 1979-05-27 is not a count",
    "max_big_fp32_blocks = -1": "max_big_fp32_blocks -1 is not a count",
}


@pytest.mark.parametrize("rule", list(TOML_TIMES))
def test_a_toml_date_or_time_is_shown_as_the_file_spells_it(
    run_cli: Any, made_run: Path, tmp_path: Path, rule: str
) -> None:
    config = tmp_path / "g.toml"
    config.write_text(f'[tool.memprobe.gate]\nrules = [{{ kernel = "*", {rule} }}]\n')
    line = one_line(*run_cli("gate", str(made_run), "--config", str(config)))
    assert TOML_TIMES[rule] in line and "datetime" not in line, line


def test_a_toml_time_as_max_regression_is_shown_as_written(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    config = tmp_path / "g.toml"
    config.write_text(f"[tool.memprobe.gate]\nmax_regression = 07:32:00\n{RULE}")
    line = one_line(*run_cli("gate", str(made_run), "--config", str(config)))
    assert "max_regression 07:32:00 is not a percentage" in line, line


# V1, vocabulary-parallel: a tp=2 case records V=256 for the case and 128 per rank; either
# is the record's, any other --vocab is refused naming both.


@pytest.mark.parametrize(("vocab", "refused"), [("256", False), ("128", False), ("512", True),
                                                ("64", True)])  # fmt: skip
def test_a_vocab_parallel_record_takes_its_whole_or_its_ranks_vocab(
    run_cli: Any, made_run: Path, tmp_path: Path, vocab: str, refused: bool
) -> None:
    import pickle

    data = pickle.loads(Path(_case_snapshot(made_run)).read_bytes())
    data["memprobe"]["case"] = "unchunked-b1-s64-v256-bf16-c1024-tp2-cp1-meta-00000000"
    snapshot = tmp_path / "rank.pickle"
    snapshot.write_bytes(pickle.dumps(data, protocol=4))
    code, out, err = run_cli("attribute", str(snapshot), "--vocab", vocab, "--top", "1")
    if refused:
        line = one_line(code, out, err)
        assert f"--vocab {vocab}, but this snapshot's case has V=256, 128 per rank" in line
    else:
        assert code == 0 and "memprobe recorded it" not in err, err
