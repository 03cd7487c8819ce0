"""Hostile inputs, round 21 (r21_files), files a user hands memprobe: run directories
resumed or gated, model config.json files and snapshots whose fields are each valid but
contradict each other. Each table is a variant of a defect class the pass found: one line
and exit 2 that names what is wrong, or an answer whose every word the file supports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line
from small_config import SMALL


def _copy(made_run: Path, to: Path) -> Path:
    shutil.copytree(made_run, to)
    return to


def _drop_last_row(run: Path) -> None:
    """One planned case left to run: what a resume writes."""
    payload = json.loads((run / "results.json").read_text())
    payload["rows"] = payload["rows"][:-1]
    (run / "results.json").write_text(json.dumps(payload))


# -- a run resumed whose results file is a link out of the run (to another run's, or a
# file a data tool such as DVC keeps in its cache): the write went through the link, so
# the other run's results.json gained rows naming snapshots it does not hold, exit 0.
# A linked snapshots/ was refused already; a link read alone (nothing to run) still is.

LINKED = ["results.json", "results.csv"]


@pytest.mark.parametrize("name", LINKED)
@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_a_resume_never_writes_through_a_link_out_of_the_run(
    run_cli: Any, made_run: Path, tmp_path: Path, name: str, how: str
) -> None:
    other = _copy(made_run, tmp_path / "other")
    _drop_last_row(other)
    run = _copy(other, tmp_path / "run")
    (run / name).unlink()
    (run / name).symlink_to(other / name if how == "absolute" else Path("..", "other", name))
    before = (other / name).read_bytes()
    err = one_line(*run_cli("sweep", "--resume", str(run), "-q", "--no-verify"))
    assert f"{run / name} is a link" in err and "leads out of the run" in err, err
    assert (other / name).read_bytes() == before and (run / name).is_symlink()


def test_a_resume_writes_through_a_link_inside_the_run(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = _copy(made_run, tmp_path / "run")
    _drop_last_row(run)
    (run / "results.json").rename(run / "results.v1.json")
    (run / "results.json").symlink_to("results.v1.json")
    code, _, err = run_cli("sweep", "--resume", str(run), "-q", "--no-verify")
    assert code == 0, err
    assert len(json.loads((run / "results.v1.json").read_text())["rows"]) == 1


# -- a baseline that is the very results being gated (a config's baseline naming the run
# a CI job gates, or --baseline spelled another way): every regression check compared the
# run with itself and passed, "passed: all 4 check(s)".


def _same_run(run: Path, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "alias").symlink_to(run)
    return {
        "the run folder": str(run),
        "its results.json": str(run / "results.json"),
        "a link to the folder": str(tmp_path / "alias"),
        "another spelling": str(run / ".." / run.name / "results.json"),
    }


@pytest.mark.parametrize(
    "spelling", ["the run folder", "its results.json", "a link to the folder", "another spelling"]
)
@pytest.mark.parametrize("where", ["--baseline", "config"])
def test_a_baseline_that_is_the_gated_run_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path, spelling: str, where: str
) -> None:
    baseline = _same_run(made_run, tmp_path)[spelling]
    rules = '[tool.memprobe.gate]\nrules = [{kernel="*", max_peak="1TiB"}]\n'
    if where == "config":
        rules += f"baseline = {json.dumps(baseline)}\n"
    (tmp_path / "pyproject.toml").write_text(rules)
    args = ["gate", str(made_run), "--config", str(tmp_path / "pyproject.toml")]
    err = one_line(*run_cli(*args, *(["--baseline", baseline] if where == "--baseline" else [])))
    assert "is the results being gated" in err and "compared with itself" in err, err


def test_a_baseline_copied_from_the_run_still_compares(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    shutil.copy(made_run / "results.json", tmp_path / "base.json")
    (tmp_path / "pyproject.toml").write_text('[tool.memprobe.gate]\nbaseline = "base.json"\n')
    code, out, err = run_cli("gate", str(made_run), "--config", str(tmp_path / "pyproject.toml"))
    assert code == 0 and "passed" in out, err


# -- one setting under two names its config class maps (attribute_map) beyond the sizes
# every model has: Mixtral's num_experts is its num_local_experts, GPT-2's n_positions its
# max_position_embeddings. Given both and disagreeing, transformers built one of them
# without a word (64 experts a layer where the config also said 4).

MIXTRAL = {**SMALL, "model_type": "mixtral", "num_experts_per_tok": 2}
GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512}
TWO_NAMES = {
    "mixtral experts": ({**MIXTRAL, "num_local_experts": 4, "num_experts": 64}, "num_experts"),
    "qwen3_moe experts": (
        {**MIXTRAL, "model_type": "qwen3_moe", "num_experts": 4, "num_local_experts": 8,
         "moe_intermediate_size": 32},
        "num_local_experts",
    ),
    "gpt2 positions": ({**GPT2, "n_positions": 64, "max_position_embeddings": 32}, "n_positions"),
    "dbrx positions": (
        {"model_type": "dbrx", "d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 512,
         "max_seq_len": 64, "max_position_embeddings": 128},
        "max_seq_len",
    ),
}  # fmt: skip


@pytest.mark.parametrize("what", sorted(TWO_NAMES))
def test_one_setting_under_two_names_that_disagree_is_one_line(
    run_cli: Any, tmp_path: Path, what: str
) -> None:
    config, name = TWO_NAMES[what]
    (tmp_path / "config.json").write_text(json.dumps(config))
    err = one_line(*run_cli("step", "--config", str(tmp_path), "--tokens", "16"))
    assert "two names for one size" in err and name in err, err


def test_one_setting_under_two_names_that_agree_is_built(run_cli: Any, tmp_path: Path) -> None:
    config = {**MIXTRAL, "num_local_experts": 4, "num_experts": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = run_cli("step", "--config", str(tmp_path), "--tokens", "16")
    assert code == 0 and "mixtral" in out, err


# -- a table of learned positions of a negative size: the size check knew counts and
# widths by their names (num_*, *_size, ...), not max_position_embeddings; OPT's -5
# failed on meta ("negative dimension -3"), Llama's (RoPE builds no table) was taken.

OPT = {"model_type": "opt", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
       "vocab_size": 512, "ffn_dim": 128, "word_embed_proj_dim": 64}  # fmt: skip
NEGATIVE_POSITIONS = {
    "opt": {**OPT, "max_position_embeddings": -5},
    "llama": {**SMALL, "max_position_embeddings": -1},
    "mistral": {**SMALL, "model_type": "mistral", "max_position_embeddings": -4096},
}


@pytest.mark.parametrize("command", ["step", "plan --step"])
@pytest.mark.parametrize("what", sorted(NEGATIVE_POSITIONS))
def test_a_negative_position_table_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(NEGATIVE_POSITIONS[what]))
    args = {
        "step": ["step", "--config", str(tmp_path), "--tokens", "16"],
        "plan --step": ["plan", "--step", "--config", str(tmp_path), "--budget", "1GiB"],
    }[command]
    err = one_line(*run_cli(*args))
    assert "'max_position_embeddings' is" in err and "a size is 0 or more" in err, err


# -- an OOM whose request is no larger than the largest free block then (a request on
# another stream or in the other pool, or a trace that is not the allocator's own): the
# verdict said "no single free block was large enough" beside "largest free block 1.00
# MiB" for a 512 KiB request. It now says the free block could hold it, and why it may not.

BASE = 0x7D00_0000_0000
MIB = 1 << 20


def _oom_snapshot(tmp_path: Path, request: int) -> str:
    """A 4 MiB segment holding two live 1 MiB blocks (two 1 MiB free blocks between them),
    then an OOM of ``request`` bytes."""
    from memprobe.snapshot.write import write_snapshot

    frames = [{"filename": "/home/u/train.py", "line": 10, "name": "step"}]
    entry = {"stream": 0, "frames": frames}
    trace = [{**entry, "action": "segment_alloc", "addr": BASE, "size": 4 * MIB}]
    trace += [{**entry, "action": "alloc", "addr": BASE + i * 2 * MIB, "size": MIB} for i in (0, 1)]
    trace.append({**entry, "action": "oom", "addr": 0, "size": request, "device_free": 0})
    blocks = [
        {"address": BASE + i * MIB, "size": MIB, "requested_size": MIB * (1 - i % 2),
         "state": "inactive" if i % 2 else "active_allocated", "frames": frames}
        for i in range(4)
    ]  # fmt: skip
    segment = {"device": 0, "address": BASE, "total_size": 4 * MIB, "stream": 0,
               "segment_type": "large", "is_expandable": False, "blocks": blocks}  # fmt: skip
    path = tmp_path / "oom.pickle"
    write_snapshot({"segments": [segment], "device_traces": [trace]}, path)
    return str(path)


@pytest.mark.parametrize("request_bytes", [512, 512 << 10, MIB], ids=["512 B", "512 KiB", "1 MiB"])
def test_an_oom_that_a_free_block_could_hold_is_not_called_too_large(
    run_cli: Any, tmp_path: Path, request_bytes: int
) -> None:
    code, out, err = run_cli("attribute", _oom_snapshot(tmp_path, request_bytes))
    verdict = next(line for line in out.splitlines() if "verdict:" in line)
    assert code == 0 and "largest free block 1.00 MiB" in out, (out, err)
    assert "no single free block was large enough" not in verdict, verdict
    assert "free but not usable" in verdict and "another stream" in verdict, verdict


def test_an_oom_larger_than_every_free_block_is_still_fragmentation(
    run_cli: Any, tmp_path: Path
) -> None:
    code, out, err = run_cli("attribute", _oom_snapshot(tmp_path, 3 * MIB // 2))
    assert code == 0 and "no single free block was large enough" in out, (out, err)


# -- a run resumed whose results.csv (or results.json) is not a file it can replace (a
# folder, a FIFO): the resume ran its cases, then failed writing, their rows unwritten.
# It is refused before any case runs.


def _fifo(path: Path) -> None:
    import os

    os.mkfifo(path)


@pytest.mark.parametrize("make", [Path.mkdir, _fifo], ids=["a folder", "a FIFO"])
def test_a_resume_whose_results_csv_cannot_be_written_runs_nothing(
    run_cli: Any, made_run: Path, tmp_path: Path, make: Any
) -> None:
    run = _copy(made_run, tmp_path / "run")
    _drop_last_row(run)
    (run / "results.csv").unlink()
    make(run / "results.csv")

    def written() -> dict[str, int]:
        return {p.name: p.stat().st_mtime_ns for p in (run / "snapshots").iterdir()}

    before = written()
    err = one_line(*run_cli("sweep", "--resume", str(run), "-q", "--no-verify"))
    assert "results.csv is not a file the run can write" in err, err
    assert written() == before  # no case ran


# -- a device whose trace is empty but whose segments hold memory (idle while history was
# recorded, or its weights allocated before recording began): `attribute` of every device
# read only the devices with a trace, so its live blocks were in no line and no
# other_devices entry. It is now read as a device without a trace, never the lead.


def _idle_device_snapshot(made_run: Path, tmp_path: Path, held: int) -> str:
    import pickle

    from memprobe.snapshot.write import write_snapshot

    snap = pickle.loads(next((made_run / "snapshots").glob("*.pickle")).read_bytes())
    address = 0x7A00_0000_0000
    block = {"address": address, "size": held, "requested_size": held,
             "state": "active_allocated", "frames": []}  # fmt: skip
    snap["segments"].append(
        {
            "device": 1,
            "address": address,
            "total_size": held,
            "stream": 0,
            "segment_type": "large",
            "is_expandable": False,
            "blocks": [block],
        }  # fmt: skip
    )
    snap["device_traces"].append([])
    write_snapshot(snap, tmp_path / "two.pickle")
    return str(tmp_path / "two.pickle")


@pytest.mark.parametrize("held", [2 * MIB, 64 * MIB], ids=["less", "more than the step"])
def test_a_device_with_segments_and_no_trace_is_read(
    run_cli: Any, made_run: Path, tmp_path: Path, held: int
) -> None:
    path = _idle_device_snapshot(made_run, tmp_path, held)
    code, out, err = run_cli("attribute", path)
    assert code == 0, err
    assert out.startswith("2 devices, 1 with a trace (device 0: peak"), out
    assert "device 1: no trace" in out and "device 1: no trace; what the segments hold" in out
    code, out, err = run_cli("attribute", path, "--json")
    lead = json.loads(out)
    assert code == 0 and lead["device"] == 0, err  # the recorded step leads
    assert [d["device"] for d in lead["other_devices"]] == [1]
    assert lead["other_devices"][0]["peak_allocated_bytes"] == held


def test_a_device_with_no_trace_does_not_lead_a_diff(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    path = _idle_device_snapshot(made_run, tmp_path, 64 * MIB)
    code, out, err = run_cli("diff", str(next((made_run / "snapshots").glob("*.pickle"))), path)
    assert code == 0 and "the lead of its" not in out, (out, err)
    assert "peak: 112.25 KiB -> 112.25 KiB" in out, out
