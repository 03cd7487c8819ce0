"""Hostile inputs, round 29 (files): results, baselines and gate configs whose numbers
sit exactly on a limit the user wrote as a decimal (each limit is the decimal as written,
compared in whole bytes: a peak exactly at it passes, one byte over fails), and gate
outputs that cannot be written beside one that can (refused before anything is written),
a snapshot's allocator settings table with entries missing (not modelled), and a row
whose peak its own memprobe snapshot contradicts (the snapshot is not used). Each table
is a variant of a defect class the pass found."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

from memprobe.io.sizes import parse_size


def _peak_set(made_run: Path, to: Path, peak: int) -> Path:
    """A copy of ``made_run`` whose every row peaks at ``peak`` bytes (the figures a peak
    holds left out: a peak of 1,000 B holds no 80 KiB forward peak)."""
    run = Path(shutil.copytree(made_run, to))
    payload = json.loads((run / "results.json").read_text())
    for row in payload["rows"]:
        row["peak_bytes"] = peak
        for part in ("forward_peak_bytes", "backward_peak_bytes", "floor_bytes"):
            row[part] = None
        if row["reserved_peak_bytes"] is not None:  # modelled reserved holds the peak
            row["reserved_peak_bytes"] = max(row["reserved_peak_bytes"], peak)
    (run / "results.json").write_text(json.dumps(payload))
    return run


def _config(here: Path, rule: str = "") -> str:
    rules = f'rules = [{{kernel = "*", {rule}}}]' if rule else "rules = []"
    (here / "pyproject.toml").write_text(f"[tool.memprobe.gate]\n{rules}\n")
    return str(here / "pyproject.toml")


# -- R1: a peak exactly the growth --max-regression allows over the baseline. The limit was
# the baseline times 1 + p/100 in floats, just under the exact bytes for 13, 15, 36, 57 ...
# percent: 115 MiB over a baseline of 100 MiB at --max-regression 15 FAILed "(+15.00%,
# allowed +15.00% = 115.00 MiB): over by 0 B", exit 1. The growth is the decimal as typed.

# (percent as typed, baseline peak, the peak exactly that much above it)
ON_THE_LIMIT = {
    "15% of 100 MiB": ("15", 100 * 2**20, 115 * 2**20),
    "13% of 100 MiB": ("13", 100 * 2**20, 118_489_088),
    "36% of 1,000 B": ("36", 1000, 1360),
    "57% of 1 GB": ("57", 10**9, 1_570_000_000),
    "12.5% of 2,000 B": ("12.5", 2000, 2250),
    "0% (the default)": ("0", 4096, 4096),
}


@pytest.mark.parametrize("what", sorted(ON_THE_LIMIT))
def test_a_peak_exactly_at_the_allowed_regression_passes(
    run_cli: Any, made_run: Path, here: Path, what: str
) -> None:
    percent, base_peak, peak = ON_THE_LIMIT[what]
    base = _peak_set(made_run, here / "base", base_peak)
    run = _peak_set(made_run, here / "run", peak)
    args = ["gate", str(run), "--baseline", str(base), "--config", _config(here)]
    code, out, err = run_cli(*args, "--max-regression", percent)
    assert code == 0 and "FAIL" not in out and "passed" in out, (out, err)


@pytest.mark.parametrize("what", sorted(ON_THE_LIMIT))
def test_a_peak_a_byte_over_the_allowed_regression_fails(
    run_cli: Any, made_run: Path, here: Path, what: str
) -> None:
    percent, base_peak, peak = ON_THE_LIMIT[what]
    base = _peak_set(made_run, here / "base", base_peak)
    run = _peak_set(made_run, here / "run", peak + 1)
    args = ["gate", str(run), "--baseline", str(base), "--config", _config(here)]
    code, out, err = run_cli(*args, "--max-regression", percent)
    assert code == 1 and "over by 1 B" in out, (out, err)


# A growth past a float's range is still no traceback (the exact limit is printed as inf).
@pytest.mark.parametrize("percent", ["1e307", "1.7e308", "1e300"])
def test_a_growth_past_a_floats_range_passes_every_peak(
    run_cli: Any, made_run: Path, here: Path, percent: str
) -> None:
    base = _peak_set(made_run, here / "base", 100 * 2**20)
    run = _peak_set(made_run, here / "run", 2**62)
    args = ["gate", str(run), "--baseline", str(base), "--config", _config(here)]
    code, out, err = run_cli(*args, "--max-regression", percent, "--junit-xml", "j.xml")
    assert code == 0 and "FAIL" not in out and not err, (out, err)


def test_a_config_max_regression_on_the_limit_passes(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    base = _peak_set(made_run, here / "base", 100 * 2**20)
    run = _peak_set(made_run, here / "run", 115 * 2**20)
    (here / "pyproject.toml").write_text(
        f'[tool.memprobe.gate]\nrules = []\nbaseline = "{base / "results.json"}"\n'
        "max_regression = 15\n"
    )
    code, out, err = run_cli("gate", str(run), "--config", str(here / "pyproject.toml"))
    assert code == 0 and "allowed +15.00% = 115.00 MiB" in out, (out, err)


# -- S1: a size written as a decimal in a unit ("8.2GB", "1.005KB", a max_peak, a
# --budget): it was read through a float and cut to whole bytes, 8,199,999,999 for 8.2 GB
# and 1,004 for 1.005 KB, so a gate rule's max_peak = "8.2GB" FAILed a peak of exactly
# 8.2 GB "over by 1 B"; a byte count past 2^53 lost its last digits. Read exactly now.

EXACT_SIZES = {
    "8.2GB": 8_200_000_000,
    "4.35TB": 4_350_000_000_000,
    "1.005KB": 1005,
    "1.15 GB": 1_150_000_000,
    "2.3MB": 2_300_000,
    "9007199254740993": 2**53 + 1,
    "9007199254740993 B": 2**53 + 1,
    "10.3GiB": 11_059_540_787,  # a fraction of a byte rounds down, as before
    "0.1KiB": 102,
    "0" * 5000 + "5MiB": 5 * 2**20,
    "0." + "1" * 100_000 + "GiB": 119_304_647,  # long, read in bounded time
}


@pytest.mark.parametrize("text", sorted(EXACT_SIZES), ids=lambda t: t[:24])
def test_a_decimal_size_is_read_exactly(text: str) -> None:
    assert parse_size(text) == EXACT_SIZES[text]


NOT_WHOLE_BYTES = ["1." + "0" * 100 + "1 B", "1." + "0" * 100_000 + "1", "0.5", "1.5 B"]


@pytest.mark.parametrize("text", NOT_WHOLE_BYTES, ids=lambda t: t[:12])
def test_a_fraction_of_a_byte_far_down_is_still_refused(text: str) -> None:
    from memprobe.errors import UserError

    with pytest.raises(UserError, match="not a whole number of bytes"):
        parse_size(text)


@pytest.mark.parametrize("limit", ["8.2GB", "8.2 GB", "8200MB"])
def test_a_rule_max_peak_in_decimal_units_passes_the_peak_at_it(
    run_cli: Any, made_run: Path, here: Path, limit: str
) -> None:
    run = _peak_set(made_run, here / "run", 8_200_000_000)
    code, out, err = run_cli("gate", str(run), "--config", _config(here, f'max_peak = "{limit}"'))
    assert code == 0 and "FAIL" not in out, (out, err)
    over = _peak_set(made_run, here / "over", 8_200_000_001)
    code, out, err = run_cli("gate", str(over), "--config", _config(here, f'max_peak = "{limit}"'))
    assert code == 1 and "over by 1 B" in out, (out, err)


# -- G2: a --junit-xml the gate cannot write (a folder, a path under a file, a device)
# beside --update-baseline: the baseline was replaced first, then the JUnit file refused,
# exit 2 with the user's baseline gone (and, without RESULTS, after the gate's own sweep).
# Every output is refused before anything is written.

UNWRITABLE = {
    "a folder": lambda here: here / "folder",
    "under a file": lambda here: here / "afile" / "j.xml",
    "a device": lambda here: Path("/dev/null"),
}


def _unwritable(here: Path, what: str) -> Path:
    (here / "folder").mkdir(exist_ok=True)
    (here / "afile").write_text("a file\n")
    return UNWRITABLE[what](here)


@pytest.mark.parametrize("what", sorted(UNWRITABLE))
def test_an_unwritable_junit_file_leaves_the_baseline_as_it_was(
    run_cli: Any, made_run: Path, here: Path, what: str
) -> None:
    kept = here / "baseline.json"
    kept.write_text('{"the": "old baseline"}\n')
    junit = _unwritable(here, what)
    args = ["gate", str(made_run), "--config", _config(here, 'max_peak = "1GiB"')]
    err = one_line(*run_cli(*args, "--junit-xml", str(junit), "--update-baseline", str(kept)))
    assert "cannot write JUnit file" in err, err
    assert kept.read_text() == '{"the": "old baseline"}\n'


@pytest.mark.parametrize("what", sorted(UNWRITABLE))
def test_an_unwritable_baseline_writes_no_junit_file(
    run_cli: Any, made_run: Path, here: Path, what: str
) -> None:
    baseline = _unwritable(here, what)
    args = ["gate", str(made_run), "--config", _config(here, 'max_peak = "1GiB"')]
    junit = here / "j.xml"
    err = one_line(*run_cli(*args, "--junit-xml", str(junit), "--update-baseline", str(baseline)))
    assert "cannot write baseline" in err and not junit.exists(), err


def test_the_gates_own_sweep_is_not_run_for_an_unwritable_junit_file(
    run_cli: Any, here: Path
) -> None:
    (here / "pyproject.toml").write_text(
        '[tool.memprobe.sweep]\ntokens = [64]\nvocab = 128\nkernel = ["unchunked"]\n'
        'device = "meta"\n[tool.memprobe.gate]\nrules = [{kernel = "*", max_peak = "1GiB"}]\n'
    )
    err = one_line(*run_cli("gate", "--out", str(here / "out"), "--junit-xml", str(here)))
    assert "cannot write JUnit file" in err and not (here / "out").exists(), err


# -- D2: a snapshot's roundup_power2_divisions table with intervals missing. torch writes
# one entry per interval from 1 MiB up ({"1": d, "2": d, "4": d, ...}); the counts were
# read in key order, one per interval, so {"1": 0, "64": 8} put 64 MiB's 8 at 2 MiB and
# `attribute --replay` modelled roundup_power2_divisions:[1:0,>:8], where the file says
# [32:0,>:8]. Such a table is no setting torch has: the defaults stand.

ADDR, MIB = 0x7F00_0000_0000, 1 << 20


def _divisions_snapshot(here: Path, table: Any) -> str:
    frames = [{"filename": "train.py", "line": 7, "name": "step"}]
    block = {"address": ADDR, "size": 2 * MIB, "requested_size": MIB, "state": "active_allocated"}
    seg = {
        "device": 0, "address": ADDR, "total_size": 2 * MIB, "allocated_size": 2 * MIB,
        "active_size": 2 * MIB, "requested_size": MIB, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames,
        "blocks": [{**block, "frames": frames}],
    }  # fmt: skip
    trace = [
        {"action": a, "addr": ADDR, "size": n, "stream": 0, "frames": frames}
        for a, n in (("segment_alloc", 2 * MIB), ("alloc", MIB))
    ]
    settings = {
        "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
        "garbage_collection_threshold": 0.0, "expandable_segments": False,
        "roundup_power2_divisions": table,
    }  # fmt: skip
    path = here / "s.pickle"
    snap = {"segments": [seg], "device_traces": [trace], "allocator_settings": settings}
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return str(path)


FULL = {str(1 << i): 8 if 1 << i >= 64 else 0 for i in range(16)}
MISSING_INTERVALS = {
    "1 and 64 only": {"1": 0, "64": 8},
    "64 before 1": {"64": 8, "1": 0},
    "no 1 MiB entry": {k: v for k, v in FULL.items() if k != "1"},
    "one interval left out": {k: v for k, v in FULL.items() if k != "32"},
    "1 MiB twice (text and number)": {"1": 0, 1: 8, "2": 8},
}


@pytest.mark.parametrize("what", sorted(MISSING_INTERVALS))
def test_a_divisions_table_with_intervals_missing_is_not_modelled(
    run_cli: Any, here: Path, what: str
) -> None:
    snap = _divisions_snapshot(here, MISSING_INTERVALS[what])
    code, out, err = run_cli("attribute", snap, "--replay")
    assert code == 0 and "caching-allocator model, default settings" in out, (out, err)


TORCH_TABLES = {
    "every interval": (FULL, "roundup_power2_divisions:[32:0,>:8]"),
    "keys as numbers": ({int(k): v for k, v in FULL.items()}, "[32:0,>:8]"),
    "the first intervals only": ({"1": 0, "2": 4}, "roundup_power2_divisions:[1:0,>:4]"),
}


@pytest.mark.parametrize("what", sorted(TORCH_TABLES))
def test_a_divisions_table_as_torch_writes_it_is_modelled(
    run_cli: Any, here: Path, what: str
) -> None:
    table, said = TORCH_TABLES[what]
    code, out, err = run_cli("attribute", _divisions_snapshot(here, table), "--replay")
    assert code == 0 and said in out, (out, err)


# -- E1: a row whose peak_bytes its own snapshot contradicts. memprobe writes the row and
# the snapshot from one measurement (the snapshot's allocated bytes are exact), yet a row
# edited to 10x its peak was drawn beside its snapshot's trace peaking at the old value:
# the page's table said 1.10 MiB, its figure and breakdown 112.25 KiB, without a word.
# The snapshot is not used, and the page says why.

PEAK_EDITS = {
    "ten times": lambda peak: peak * 10,
    "one byte more": lambda peak: peak + 1,
    "one byte less": lambda peak: peak - 1,
}


def _report(run_cli: Any, run: Path, here: Path) -> str:
    page = here / "page.html"
    code, out, err = run_cli("report", str(run), "--out", str(page))
    assert code == 0 and not err, (out, err)
    return page.read_text()


@pytest.mark.parametrize("what", sorted(PEAK_EDITS))
def test_a_row_its_own_snapshot_contradicts_is_drawn_without_it(
    run_cli: Any, made_run: Path, here: Path, what: str
) -> None:
    run = Path(shutil.copytree(made_run, here / "run"))
    payload = json.loads((run / "results.json").read_text())
    row = payload["rows"][0]
    row["peak_bytes"] = PEAK_EDITS[what](row["peak_bytes"])
    row["forward_peak_bytes"] = row["backward_peak_bytes"] = None
    (run / "results.json").write_text(json.dumps(payload))
    page = _report(run_cli, run, here)
    assert "snapshot not used" in page and "the results or the snapshot were edited" in page


def test_a_row_and_its_snapshot_as_written_are_drawn_together(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    assert "snapshot not used" not in _report(run_cli, made_run, here)


def test_a_torch_snapshot_in_the_run_is_not_held_to_the_rows_peak(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    # torch's own snapshot holds the whole process: its peak is not the kernel's.
    run = Path(shutil.copytree(made_run, here / "run"))
    payload = json.loads((run / "results.json").read_text())
    snap_path = run / payload["rows"][0]["snapshot"]
    snap = pickle.loads(snap_path.read_bytes())
    del snap["memprobe"]
    snap_path.write_bytes(pickle.dumps(snap))
    assert "the results or the snapshot were edited" not in _report(run_cli, run, here)


# The gate named that snapshot's largest block as the failure's evidence: it says why not.
def test_the_gate_does_not_explain_a_failure_by_a_snapshot_its_row_contradicts(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    run = _peak_set(made_run, here / "run", 5 * 2**20)
    code, out, err = run_cli("gate", str(run), "--config", _config(here, 'max_peak = "1MiB"'))
    assert code == 1 and "the results or the snapshot were edited; not read" in out, (out, err)
    assert "its largest block live at the peak" not in out


# A row of ranks (tp or cp above 1) holds the largest rank's peak and its snapshot rank
# 0's: a snapshot that peaks lower is that rank's, not an edit; one that peaks higher is.
RANK_ROWS = {
    "tp 2, snapshot lower": ({"tp": 2, "cp": 1}, +1, False),
    "cp 2, snapshot lower": ({"tp": 1, "cp": 2}, +1, False),
    "tp 2, snapshot higher": ({"tp": 2, "cp": 1}, -1, True),
    "one rank, snapshot lower": ({"tp": 1, "cp": 1}, +1, True),
    "one rank, snapshot as the row": ({"tp": 1, "cp": 1}, 0, False),
}


@pytest.mark.parametrize("what", sorted(RANK_ROWS))
def test_a_row_of_ranks_may_peak_above_rank_0s_snapshot(made_run: Path, what: str) -> None:
    from memprobe.snapshot.load import load_snapshot
    from memprobe.snapshot.synthesize import contradicted_peak

    row = json.loads((made_run / "results.json").read_text())["rows"][0]
    snapshot = load_snapshot(made_run / row["snapshot"])
    layout, shift, said = RANK_ROWS[what]
    edited = {**row, **layout, "peak_bytes": row["peak_bytes"] + shift}
    assert (contradicted_peak(snapshot, edited) is not None) is said
