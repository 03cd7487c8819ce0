"""Every meta/cpu case gets a modelled reserved peak, from memprobe's allocator model."""

from __future__ import annotations

import json
from pathlib import Path

from memprobe.results import read_rows
from memprobe.sweep import plan_cases, run_sweep

V = 32768


def sweep(tmp_path: Path, name: str, **kwargs: object) -> list[dict]:
    cases = plan_cases(tokens=[4096], vocab=[V], ladder=False, device="meta")
    run_sweep(cases, tmp_path / name, verify=False, **kwargs)  # type: ignore[arg-type]
    return read_rows(tmp_path / name)


def test_modelled_reserved_is_never_below_allocated(tmp_path: Path) -> None:
    rows = sweep(tmp_path, "run")
    for row in rows:
        assert row["reserved_source"] == "modelled"
        assert row["reserved_peak_bytes"] >= row["peak_bytes"], row["kernel"]
    by = {r["kernel"]: r for r in rows}
    # A kernel that frees nothing mid-step reserves its blocks rounded to 2 MiB, no more.
    unchunked = by["unchunked"]
    assert unchunked["reserved_peak_bytes"] - unchunked["peak_bytes"] < 8 * 2**20


def test_alloc_conf_changes_the_model_and_is_recorded(tmp_path: Path) -> None:
    from memprobe.allocator import parse_alloc_conf

    default = {r["kernel"]: r["reserved_peak_bytes"] for r in sweep(tmp_path, "a")}
    conf = parse_alloc_conf("expandable_segments:True")
    expandable = {
        r["kernel"]: r["reserved_peak_bytes"] for r in sweep(tmp_path, "b", alloc_conf=conf)
    }
    # The naive chunk loop fragments the cache: expandable segments reserve less for it.
    assert expandable["naive_chunked"] < default["naive_chunked"]
    meta = json.loads((tmp_path / "b" / "run.json").read_text())
    assert meta["alloc_conf"] == "expandable_segments:True"


def test_synthesized_snapshot_agrees_with_the_row(tmp_path: Path) -> None:
    from memprobe.snapshot.load import load_snapshot

    rows = sweep(tmp_path, "run")
    row = next(r for r in rows if r["kernel"] == "naive_chunked")
    snap = load_snapshot(tmp_path / "run" / row["snapshot"])
    reserved = peak = 0
    for entry in snap["device_traces"][0]:
        if entry["action"] in ("segment_alloc", "segment_map"):
            reserved += entry["size"]
        elif entry["action"] in ("segment_free", "segment_unmap"):
            reserved -= entry["size"]
        peak = max(peak, reserved)
    assert peak == row["reserved_peak_bytes"]
    # The freed chunk outputs stay cached: the viewer sees inactive blocks.
    assert any(b["state"] == "inactive" for s in snap["segments"] for b in s["blocks"])


def test_sweep_cli_takes_alloc_conf(run_cli, tmp_path: Path) -> None:
    code, _, err = run_cli("sweep", "--alloc-conf", "max_split_size_mb:1", "--device", "meta")
    assert code == 2 and "max_split_size_mb" in err
