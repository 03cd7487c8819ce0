"""Hostile inputs, round 24 (r24_files), files a user hands memprobe: snapshot pickles
whose segments or allocator settings hold values torch never writes, and model
config.json files whose fields are not sizes but change how transformers builds or runs
the model. Each table is a variant of a defect class the pass found: one line and exit 2
that names what is wrong, or an answer whose every word the file supports."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line
from small_config import SMALL

ADDR = 0x7F00_0000_0000
MIB = 1 << 20


def _segment(**fields: Any) -> dict[str, Any]:
    """One 2 MiB segment as torch lists it: a live 1 MiB block and a free one."""
    frames = [{"filename": "train.py", "line": 7, "name": "step"}]
    blocks = [
        {"address": ADDR, "size": MIB, "requested_size": MIB, "state": "active_allocated"},
        {"address": ADDR + MIB, "size": MIB, "requested_size": 0, "state": "inactive"},
    ]
    seg = {
        "device": 0, "address": ADDR, "total_size": 2 * MIB, "allocated_size": MIB,
        "active_size": MIB, "requested_size": MIB, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames,
        "blocks": [{**b, "frames": frames} for b in blocks],
    }  # fmt: skip
    return {**seg, **fields}


def _trace() -> list[dict[str, Any]]:
    """The segment made, its live block allocated, a second block made and freed."""
    frames = [{"filename": "train.py", "line": 7, "name": "step"}]
    steps = [
        ("segment_alloc", ADDR, 2 * MIB),
        ("alloc", ADDR, MIB),
        ("alloc", ADDR + MIB, MIB // 2),
        ("free_requested", ADDR + MIB, MIB // 2),
        ("free_completed", ADDR + MIB, MIB // 2),
    ]
    return [
        {"action": a, "addr": addr, "size": size, "stream": 0, "frames": frames}
        for a, addr, size in steps
    ]


def _snapshot(tmp_path: Path, seg: dict[str, Any], settings: Any = None) -> str:
    snap: dict[str, Any] = {"segments": [seg], "device_traces": [_trace()]}
    if settings is not None:
        snap["allocator_settings"] = settings
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return str(path)


# -- a segment whose pool or kind is not one torch writes (torch: a pair of pool ids, (0, 0)
# for the default pools; "small" or "large"): a segment_pool_id of 5 ended `attribute
# --replay` in a TypeError traceback, "ab" or three ids were replayed as a private pool (a
# note said so), and a segment_type "huge" was counted as neither ("1 segment (0 large, 0
# small, 0 expandable)"). Each is now refused as the block states torch never writes are.

NOT_TORCHS = {
    "a pool id that is a number": ({"segment_pool_id": 5}, "segment_pool_id 5"),
    "a pool id that is text": ({"segment_pool_id": "ab"}, "segment_pool_id 'ab'"),
    "three pool ids": ({"segment_pool_id": [1, 2, 3]}, "segment_pool_id [1, 2, 3]"),
    "a pair holding a float": ({"segment_pool_id": (0, 0.5)}, "segment_pool_id (0, 0.5)"),
    "a kind torch has not": ({"segment_type": "huge"}, "segment_type 'huge'"),
    "a kind in capitals": ({"segment_type": "LARGE"}, "segment_type 'LARGE'"),
}


@pytest.mark.parametrize("flags", [[], ["--replay"]], ids=["attribute", "--replay"])
@pytest.mark.parametrize("what", sorted(NOT_TORCHS))
def test_a_segment_pool_or_kind_torch_never_writes_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, flags: list[str]
) -> None:
    fields, said = NOT_TORCHS[what]
    err = one_line(*run_cli("attribute", _snapshot(tmp_path, _segment(**fields)), *flags))
    assert f"segments[0] has {said}" in err and "not a valid CUDA memory snapshot" in err, err


# What torch and other tools write is read as before: a private pool's pair (a note says
# the model puts its requests in the default pools), a list pair from a JSON round trip, no
# pool at all, and a segment without its kind (its size decides it).
TORCHS = {
    "a private pool": {"segment_pool_id": (1, 3)},
    "a pool pair as a list": {"segment_pool_id": [0, 0]},
    "no pool id": {"segment_pool_id": None},
    "no kind": {"segment_type": None},
    "a small segment": {"segment_type": "small"},
}


@pytest.mark.parametrize("what", sorted(TORCHS))
def test_a_segment_pool_and_kind_torch_writes_replays(
    run_cli: Any, tmp_path: Path, what: str
) -> None:
    code, out, err = run_cli("attribute", _snapshot(tmp_path, _segment(**TORCHS[what])), "--replay")
    assert code == 0 and "replay on device 0" in out and "1 segment (" in out, (out, err)


# -- a recorded max_split_size below what torch accepts (kLargeBuffer, 20 MiB; torch refuses
# less, as --alloc-conf does): 1,000 bytes was replayed as "max_split_size_mb:0", a setting
# no allocator runs with (and `--alloc-conf max_split_size_mb:0` is refused). Such a field
# is no setting torch has: the defaults stand, as for an unknown divisions table.

SPLITS = {"1,000 bytes": 1000, "1 MiB": MIB, "20 MiB less one byte": 20 * MIB - 1, "0": 0}


@pytest.mark.parametrize("what", sorted(SPLITS))
def test_a_recorded_split_limit_torch_refuses_is_not_modelled(
    run_cli: Any, tmp_path: Path, what: str
) -> None:
    snap = _snapshot(tmp_path, _segment(), {"max_split_size": SPLITS[what]})
    code, out, err = run_cli("attribute", snap, "--replay")
    assert code == 0 and "max_split_size_mb" not in out, (out, err)
    assert "caching-allocator model, default settings" in out, out


def test_a_recorded_split_limit_torch_takes_is_modelled(run_cli: Any, tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, _segment(), {"max_split_size": 20 * MIB})
    code, out, err = run_cli("attribute", snap, "--replay")
    assert code == 0 and "caching-allocator model, max_split_size_mb:20" in out, (out, err)


def _config(tmp_path: Path, **extra: Any) -> str:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, **extra}))
    return str(tmp_path)


def _step_args(command: str, config: str, *kernel: str) -> list[str]:
    return {
        "step": ["step", "--config", config, "--tokens", "16", *kernel],
        "plan --step": ["plan", "--step", "--config", config, "--budget", "1GiB", *kernel],
    }[command]


# -- a config saved with return_dict false (for TorchScript or ONNX export): transformers'
# causal LMs read their base model's outputs by name, so the model could not run at all,
# and the step failed on meta ("'tuple' object has no attribute 'last_hidden_state'") with
# a hint to check the config's sizes. How outputs are packed allocates nothing: the step
# runs as the same config without it.

PACKED = {
    "return_dict false": {"return_dict": False},
    "return_dict false with torchscript": {"return_dict": False, "torchscript": True},
    "return_dict false, tied embeddings": {"return_dict": False, "tie_word_embeddings": True},
}


@pytest.mark.parametrize("kernel", [[], ["--kernel", "unchunked"]], ids=["hidden", "logits"])
@pytest.mark.parametrize("what", sorted(PACKED))
def test_a_config_returning_tuples_steps_as_without_it(
    run_cli: Any, tmp_path: Path, what: str, kernel: list[str]
) -> None:
    packed = _config(tmp_path / "packed", **PACKED[what])
    extra = {k: v for k, v in PACKED[what].items() if k != "return_dict"}
    plain = _config(tmp_path / "plain", **extra)
    code, out, err = run_cli(*_step_args("step", packed, *kernel))
    assert code == 0, err
    assert run_cli(*_step_args("step", plain, *kernel))[1] == out.replace(packed, plain)


def test_plan_step_plans_a_config_returning_tuples(run_cli: Any, tmp_path: Path) -> None:
    # One kernel at a small budget: the plan's search is what is tried, not its length
    # (every kernel at 1 GiB searched past 100,000 tokens: a minute of CPU).
    config = _config(tmp_path, return_dict=False)
    args = ["plan", "--step", "--config", config, "--budget", "16MiB", "--kernel", "local_chunked"]
    code, out, err = run_cli(*args)
    assert code == 0 and "tokens" in out, err


# -- a classifier's label count in a causal LM's config.json: transformers names each
# label as the config loads ({i: "LABEL_i"}), so num_labels 10^9 in a 200-byte file filled
# every byte of memory (under a limit: "the llama config does not load ()", a MemoryError
# with no message). It is refused before transformers sees it.

LABELS = {"10^9": 10**9, "2^40": 2**40, "one past the cap": 2**20 + 1}


@pytest.mark.parametrize("command", ["step", "plan --step"])
@pytest.mark.parametrize("what", sorted(LABELS))
def test_a_config_naming_too_many_labels_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    err = one_line(*run_cli(*_step_args(command, _config(tmp_path, num_labels=LABELS[what]))))
    assert f"num_labels is {LABELS[what]:,}" in err and "drop num_labels" in err, err


def test_a_config_naming_a_classifiers_labels_is_built(run_cli: Any, tmp_path: Path) -> None:
    code, out, err = run_cli(*_step_args("step", _config(tmp_path, num_labels=21_841)))
    assert code == 0 and "llama" in out, err


def test_a_refusal_without_a_message_is_named_by_its_type() -> None:
    from memprobe.profile.hf_config import load_error

    assert "does not load (MemoryError)" in load_error("llama", MemoryError()).message
    said = load_error("llama", ValueError("bad \x1b]0;title\x07 value")).message
    assert "\x1b" not in said and "\x07" not in said and "bad" in said, said


# -- a sliding window of fewer than 0 tokens (mistral's, qwen2's sliding_window): the sizes
# of an architecture's own were known below 0 by their names (num_*, *_size, *_dim, ...),
# and "_window" was none of them: -5 was built and the step printed as the model's.

WINDOWS = {
    "mistral's": {"model_type": "mistral", "sliding_window": -5},
    "qwen2's, turned on": {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": -1},
    "cohere2's": {"model_type": "cohere2", "sliding_window": -4096, "head_dim": 16},
}


@pytest.mark.parametrize("command", ["step", "plan --step"])
@pytest.mark.parametrize("what", sorted(WINDOWS))
def test_a_negative_sliding_window_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    window = WINDOWS[what]["sliding_window"]
    err = one_line(*run_cli(*_step_args(command, _config(tmp_path, **WINDOWS[what]))))
    assert f"config's 'sliding_window' is {window:,}: a size is 0 or more" in err, err


def test_a_sliding_window_of_none_or_zero_is_built(run_cli: Any, tmp_path: Path) -> None:
    for window in (None, 0, 16):
        config = _config(tmp_path / str(window), model_type="mistral", sliding_window=window)
        code, out, err = run_cli(*_step_args("step", config))
        assert code == 0 and "mistral" in out, (window, err)


# -- a gate rule's max_peak_over_floor under 1 (0.06 written for "6% above the floor"): a
# peak holds its floor (a row whose floor is above its peak is refused), so no case could
# meet it; every case failed ("peak/floor 2.006x > limit 0.060x", "+inf%" at 1e-320), after
# the gate's own sweep had run them all. It is refused as the config is read.

UNDER_ONE = {"6% written as 0.06": "0.06", "a half": "0.5", "1e-320": "1e-320", "0.999": "0.999"}


@pytest.mark.parametrize("what", sorted(UNDER_ONE))
def test_a_peak_over_floor_limit_under_one_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path, what: str
) -> None:
    ratio = UNDER_ONE[what]
    config = tmp_path / "pyproject.toml"
    rule = f'{{ kernel = "*", max_peak_over_floor = {ratio} }}'
    config.write_text(f"[tool.memprobe.gate]\nrules = [{rule}]\n")
    err = one_line(*run_cli("gate", str(made_run), "--config", str(config)))
    assert f"max_peak_over_floor {float(ratio)!r} is below 1" in err and "e.g. 1.06" in err, err


def test_a_peak_over_floor_limit_of_one_is_a_rule(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    config = tmp_path / "pyproject.toml"
    rule = '{ kernel = "*", max_peak_over_floor = 1 }'
    config.write_text(f"[tool.memprobe.gate]\nrules = [{rule}]\n")
    code, out, err = run_cli("gate", str(made_run), "--config", str(config))
    assert code in (0, 1) and "peak/floor" in out, (code, err)


# -- a trace that times some entries and not others (torch times every entry or none: two
# traces merged, an edited file): the peak at an untimed entry was read beside "t=+0 us"
# of a timed one, and a trace whose first entry had no time said its entries "carry no
# time_us (older torch)" while others did. Its times are now left out, with a note why,
# as a trace whose clock runs backwards has them left out.

PARTLY = {
    "the first entry alone": [0],
    "all but the first": [1, 2, 3, 4],
    "every other entry": [1, 3],
    "all but the last": [0, 1, 2, 3],
}


def _timed(tmp_path: Path, which: list[int]) -> str:
    trace = _trace()
    for i in which:
        trace[i]["time_us"] = 1_000 * (i + 1)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [_segment()], "device_traces": [trace]}))
    return str(path)


@pytest.mark.parametrize("what", sorted(PARTLY))
def test_a_trace_timed_in_part_shows_no_time(run_cli: Any, tmp_path: Path, what: str) -> None:
    code, out, err = run_cli("attribute", _timed(tmp_path, PARTLY[what]))
    timed = len(PARTLY[what])
    assert code == 0 and f"only {timed} of the trace's 5 entries carry a time_us" in out, err
    assert "t=+" not in out and " us" not in out.replace("time_us", ""), out


def test_a_trace_timed_whole_shows_its_times(run_cli: Any, tmp_path: Path) -> None:
    code, out, err = run_cli("attribute", _timed(tmp_path, [0, 1, 2, 3, 4]))
    assert code == 0 and "t=+" in out and "carry" not in out, (out, err)
