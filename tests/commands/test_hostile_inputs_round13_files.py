"""Hostile inputs, round 13, files a user hands memprobe: snapshot pickles, TOML configs,
run folders, config.json. Each table is a variant of a defect class the pass found: one
line and exit 2, or a sane answer, never a number the file does not support."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

_FRAMES = [{"name": "forward", "filename": "/home/u/train.py", "line": 10}]


def _segment(*blocks: dict[str, Any], total: int = 20 << 20, **extra: Any) -> dict[str, Any]:
    """One segment whose blocks tile it from its start, as torch writes them."""
    address, laid = 0x7F00_0000_0000, []
    for block in blocks:
        laid.append({"address": address, "frames": _FRAMES, **block})
        address += block["size"]
    return {"device": 0, "address": 0x7F00_0000_0000, "total_size": total, "stream": 0,
            "segment_type": "large", "blocks": laid, **extra}  # fmt: skip


def _block(size: int, state: str = "active_allocated", **extra: Any) -> dict[str, Any]:
    return {"size": size, "state": state, "requested_size": size, **extra}


def _write(tmp_path: Path, data: Any, name: str = "s.pickle") -> str:
    path = tmp_path / name
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # to pickle the ints past 4,300 digits (not to read them)
    try:
        path.write_bytes(pickle.dumps(data, protocol=4))
    finally:
        sys.set_int_max_str_digits(limit)
    return str(path)


def _segments_only(*segments: dict[str, Any]) -> dict[str, Any]:
    return {"segments": list(segments), "device_traces": [[]]}


SNAPSHOT_COMMANDS = {
    "attribute": lambda s: ["attribute", s],
    "attribute --replay": lambda s: ["attribute", s, "--replay"],
    "attribute --json": lambda s: ["attribute", s, "--json"],
    "diff": lambda s: ["diff", s, s],
}


# -- a block's requested size outside the block: the allocator rounds a request up to its
# block, so what was asked is never more than the block nor below 0; read as it stood, a
# segments-only snapshot printed "peak allocated: -1.00 TiB" (or 1,024.00 TiB in a 20 MiB
# segment, or -5 B from a legacy history's real_size)

EIGHT = 8 << 20
REQUESTED = {
    "negative": (_block(EIGHT, requested_size=-(1 << 40)), "requested -1,099,511,627,776 bytes"),
    "-1": (_block(EIGHT, requested_size=-1), "requested -1 bytes"),
    "one byte over its block": (_block(EIGHT, requested_size=EIGHT + 1), "requested 8,388,609"),
    "a petabyte": (_block(EIGHT, requested_size=1 << 50), "requested 1,125,899,906,842,624"),
    "a block pending free": (
        _block(EIGHT, "active_pending_free", requested_size=EIGHT * 2),
        "requested 16,777,216",
    ),
    "a free block's below 0": (_block(EIGHT, "inactive", requested_size=-1), "requested -1"),
    "a legacy history's real_size": (
        {"size": EIGHT, "state": "active_allocated", "history": [{"real_size": -5}]},
        "requested -5 bytes",
    ),
}


@pytest.mark.parametrize("command", sorted(SNAPSHOT_COMMANDS))
@pytest.mark.parametrize("what", sorted(REQUESTED))
def test_a_request_outside_its_block_is_refused(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    block, says = REQUESTED[what]
    snap = _write(tmp_path, _segments_only(_segment(block, _block(12 << 20, "inactive"))))
    err = one_line(*run_cli(*SNAPSHOT_COMMANDS[command](snap)))
    assert "segments[0].blocks[0] " in err and says in err and "outside its block of" in err


@pytest.mark.parametrize("requested", [0, 1, EIGHT - 512, EIGHT])
def test_a_request_inside_its_block_is_read(run_cli: Any, tmp_path: Path, requested: int) -> None:
    block = _block(EIGHT, requested_size=requested)
    # A free block keeps what its last use asked for, which may be more than what is left
    # of it after a split: torch writes that, and it is not counted.
    stale = _block(12 << 20, "inactive", requested_size=18 << 20)
    snap = _write(tmp_path, _segments_only(_segment(block, stale)))
    code, out, err = run_cli("attribute", snap)
    assert code == 0, err
    from memprobe.io.sizes import format_bytes

    assert f"peak allocated: {format_bytes(requested)} at snapshot time" in out, out


# -- a segment of no bytes (a total_size of 0 tiled by a 0-byte block): `attribute
# --replay` ended in an IndexError traceback laying it out


@pytest.mark.parametrize("command", sorted(SNAPSHOT_COMMANDS))
@pytest.mark.parametrize(
    "segment",
    [
        pytest.param(_segment(_block(0, "inactive"), total=0), id="total 0, one 0-byte block"),
        pytest.param(_segment(_block(0), total=0), id="total 0, a live 0-byte block"),
        pytest.param(
            {"device": 0, "address": 0, "blocks": [_block(0, "inactive")]}, id="no total, 0 B"
        ),
    ],
)
def test_a_segment_of_no_bytes_is_refused(
    run_cli: Any, tmp_path: Path, segment: dict[str, Any], command: str
) -> None:
    snap = _write(tmp_path, _segments_only(segment))
    err = one_line(*run_cli(*SNAPSHOT_COMMANDS[command](snap)))
    assert "segments[0] holds 0 bytes" in err, err


def test_a_zero_byte_block_in_a_segment_is_still_read(run_cli: Any, tmp_path: Path) -> None:
    snap = _write(tmp_path, _segments_only(_segment(_block(0), _block(20 << 20, "inactive"))))
    code, out, err = run_cli("attribute", snap, "--replay")
    assert code == 0 and "peak reserved:  20.00 MiB" in out, err


# -- a segment on a negative device: chosen as the device to read, then refused in the
# same breath: "the snapshot has nothing for device -1 (devices with data: -1)"


@pytest.mark.parametrize("command", sorted(SNAPSHOT_COMMANDS))
@pytest.mark.parametrize("device", [-1, -(2**63)])
def test_a_segment_on_a_negative_device_is_refused(
    run_cli: Any, tmp_path: Path, device: int, command: str
) -> None:
    segment = _segment(_block(EIGHT), _block(12 << 20, "inactive"), device=device)
    snap = _write(tmp_path, _segments_only(segment))
    err = one_line(*run_cli(*SNAPSHOT_COMMANDS[command](snap)))
    assert f"segments[0] is on device {device} (CUDA numbers its devices from 0)" in err, err


@pytest.mark.parametrize("device", [0, 3, "cuda:0"])
def test_a_segment_on_a_device_from_0_is_still_read(
    run_cli: Any, tmp_path: Path, device: object
) -> None:
    segment = _segment(_block(EIGHT), _block(12 << 20, "inactive"), device=device)
    code, out, err = run_cli("attribute", _write(tmp_path, _segments_only(segment)))
    assert code == 0 and "peak allocated: 8.00 MiB" in out, err


# -- what a pickle that is no snapshot holds, quoted in the one line: a key of 5,000 digits
# raised ValueError as it was quoted (a traceback), one of 5 MB (or an action of 3 MB)
# made the line megabytes long


def _trace_of(action: str) -> dict[str, Any]:
    entry = {"action": action, "addr": 1, "size": 512, "stream": 0, "frames": []}
    return {"segments": [], "device_traces": [[entry]]}


QUOTED = {
    "a key of 5,000 digits": ({10**5000: 1}, "keys (an integer of 16,610 bits)"),
    "a negative key past 64 bits": ({-(2**64): 1}, "keys (an integer of 65 bits)"),
    "a key of 5 MB": ({"k" * 5_000_000: 1}, "keys 'kkkk"),
    "a bytes key of 1 MB": ({b"k" * 1_000_000: 1}, "keys b'kkkk"),
    "a tuple key of huge ints": ({(10**5000, 1): 1}, "keys (a tuple)"),
    "a frozenset key": ({frozenset({1}): 1}, "keys (a frozenset)"),
    "an action of 3 MB": (_trace_of("x" * 3_000_000), "(the first is 'xxxx"),
}


@pytest.mark.parametrize("command", ["attribute", "diff"])
@pytest.mark.parametrize("what", sorted(QUOTED))
def test_what_a_pickle_holds_is_quoted_short(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    data, says = QUOTED[what]
    snap = _write(tmp_path, data)
    err = one_line(*run_cli(*SNAPSHOT_COMMANDS[command](snap)))
    assert says in err and len(err) < 600, err[:600]


def test_short_keys_are_still_quoted_whole(run_cli: Any, tmp_path: Path) -> None:
    snap = _write(tmp_path, {"segmentz": [], 7: 1, 2**63: 1, None: 0})
    err = one_line(*run_cli("attribute", snap))
    assert f"keys 'segmentz', 7, {2**63}, None" in err, err


# -- TOML a config cannot hold: an integer past Python's 4,300 digits (tomllib raises a
# plain ValueError, not TOMLDecodeError), and a baseline path holding NUL (os.stat and
# realpath raise ValueError): each was a traceback from `memprobe gate`

DIGITS = "9" * 5000
CONFIGS = {
    "max_peak of 5,000 digits": (
        f'rules = [{{ kernel = "*", max_peak = {DIGITS} }}]',
        "holds an integer of more than 4,300 digits",
    ),
    "a negative count of 5,000 digits": (
        f'rules = [{{ kernel = "*", max_big_fp32_blocks = -{DIGITS} }}]',
        "holds an integer of more than 4,300 digits",
    ),
    "a tokens filter of 5,000 digits": (
        f'rules = [{{ kernel = "*", tokens = [{DIGITS}], max_peak = "1 GiB" }}]',
        "holds an integer of more than 4,300 digits",
    ),
    "max_regression of 5,000 digits": (
        f"max_regression = {DIGITS}",
        "holds an integer of more than 4,300 digits",
    ),
    "an unknown key of 5,000 digits": (f"x = {DIGITS}", "holds an integer of more than 4,300"),
    "a baseline holding NUL": (
        'baseline = "base\\u0000line.json"',
        "'baseline' holds a NUL character (\\u0000)",
    ),
    "a baseline that is NUL": ('baseline = "\\u0000"', "'baseline' holds a NUL character"),
}


@pytest.mark.parametrize("where", ["--config", "pyproject.toml"])
@pytest.mark.parametrize("what", sorted(CONFIGS))
def test_toml_a_config_cannot_hold_is_one_line(
    run_cli: Any, made_run: Path, here: Path, what: str, where: str
) -> None:
    text, says = CONFIGS[what]
    name = "g.toml" if where == "--config" else "pyproject.toml"
    (here / name).write_text(f"[tool.memprobe.gate]\n{text}\n")
    args = ["gate", str(made_run), *(["--config", name] if where == "--config" else [])]
    err = one_line(*run_cli(*args))
    assert says in err, err


def test_an_integer_of_4300_digits_is_still_read_as_a_size(made_run: Path, tmp_path: Path) -> None:
    from memprobe.config import load_config
    from memprobe.errors import UserError

    path = tmp_path / "g.toml"
    rule = f'{{ kernel = "*", max_peak = {"9" * 4300} }}'
    path.write_text(f"[tool.memprobe.gate]\nrules = [{rule}]\n")
    with pytest.raises(UserError, match="beyond the largest size"):
        load_config(path)


# -- allocator settings a run.json records that no sweep runs under: --alloc-conf refuses
# backend:cudaMallocAsync (the model is the native allocator's), yet --resume of a run
# recording it modelled the cases left as native and wrote them under that backend; a
# value that is not text was read as torch's defaults; a bad one was blamed on
# "allocator settings" the user never gave


def _resumable(made_run: Path, tmp_path: Path, alloc_conf: object) -> Path:
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    meta = json.loads((run / "run.json").read_text())
    meta["cases"].append({**meta["cases"][0], "kernel": "local_chunked"})
    if alloc_conf is _ABSENT:
        del meta["alloc_conf"]
    else:
        meta["alloc_conf"] = alloc_conf
    (run / "run.json").write_text(json.dumps(meta))
    return run


_ABSENT = object()
RECORDED = {
    "backend:cudaMallocAsync": (
        "backend:cudaMallocAsync",
        "memprobe models torch's native allocator, not cudaMallocAsync",
    ),
    "async among others": (
        "expandable_segments:False,backend:cudaMallocAsync",
        "not cudaMallocAsync",
    ),
    "a number": (5, "'5' is not settings text"),
    "a list": (["expandable_segments:True"], "is not settings text"),
    "true": (True, "'True' is not settings text"),
    "an unknown option": ("bogus:1", "unknown option 'bogus'"),
    "a bad value": ("max_split_size_mb:lots", "max_split_size_mb"),
}


@pytest.mark.parametrize("what", sorted(RECORDED))
def test_resume_refuses_allocator_settings_no_sweep_runs_under(
    run_cli: Any, made_run: Path, tmp_path: Path, what: str
) -> None:
    recorded, says = RECORDED[what]
    run = _resumable(made_run, tmp_path, recorded)
    before = (run / "results.json").read_bytes()
    err = one_line(*run_cli("sweep", "--resume", str(run), "-q", "--no-verify"))
    assert f"cannot resume {run}: its run.json records allocator settings no sweep" in err
    assert says in err, err
    assert (run / "results.json").read_bytes() == before


@pytest.mark.parametrize("what", sorted(RECORDED))
def test_a_sharded_resume_reads_the_recorded_settings_as_a_resume_does(
    made_run: Path, tmp_path: Path, what: str
) -> None:
    """`sweep --shard --resume` (its ranks under torchrun) reads run.json's settings
    through the same check: it had parsed them on its own, the async backend as native."""
    from memprobe.errors import UserError
    from memprobe.records import Grid
    from memprobe.sharded_sweep import _requested_conf
    from memprobe.sweep import SweepRequest

    recorded, says = RECORDED[what]
    run = _resumable(made_run, tmp_path, recorded)
    grid = Grid(tokens=(64,), vocab=(128,))
    with pytest.raises(UserError) as refused:
        _requested_conf(SweepRequest(grid=grid, resume=run))
    assert "records allocator settings no sweep" in refused.value.message
    assert says in refused.value.message


@pytest.mark.parametrize(
    "recorded",
    ["", "expandable_segments:True", "backend:native", None, _ABSENT],
    ids=["empty", "expandable", "native", "null", "no key"],
)
def test_resume_keeps_the_settings_a_sweep_runs_under(
    run_cli: Any, made_run: Path, tmp_path: Path, recorded: object
) -> None:
    import json

    run = _resumable(made_run, tmp_path, recorded)
    code, _, err = run_cli("sweep", "--resume", str(run), "-q", "--no-verify", "--no-report")
    assert code == 0, err
    rows = json.loads((run / "results.json").read_text())["rows"]
    assert [r["kernel"] for r in rows] == ["unchunked", "local_chunked"]


# -- config.json of a multimodal architecture (its text model's sizes read from its
# text_config), or a text_config given to one that takes none: gemma3 with its sizes at the
# top level built its defaults' 2.72B parameters for a 100K-parameter config without a
# word; with them nested, and llama given a text_config, the step "failed on meta" with a
# hint to try cpu (an AttributeError transformers raised building it)

TEXT = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512, "intermediate_size": 128,
        "head_dim": 16}  # fmt: skip
MULTIMODAL = {
    "gemma3, sizes at the top level": (
        {"model_type": "gemma3", **TEXT},
        "is a multimodal model's, whose text model's sizes are read from its text_config",
        'with model_type "gemma3_text"',
    ),
    "gemma3, sizes in text_config": (
        {"model_type": "gemma3", "text_config": TEXT},
        "memprobe step builds text-only causal LMs",
        'with model_type "gemma3_text"',
    ),
    "mllama, nothing given": (
        {"model_type": "mllama"},
        "the mllama config is a multimodal model's",
        "give the config of a text-only causal LM",
    ),
    "llama given an empty text_config": (
        {"model_type": "llama", "text_config": {}, "num_hidden_layers": 2},
        "the llama config gives a text_config, which llama does not take",
        "move the sizes to the top level",
    ),
    "llama given its sizes in a text_config too": (
        {"model_type": "llama", **TEXT, "text_config": {"hidden_size": 4096}},
        "gives a text_config, which llama does not take",
        "drop text_config",
    ),
}


def _stepping(tmp_path: Path, config: dict[str, Any], command: str) -> list[str]:
    """``memprobe step`` or ``plan --step`` of ``config`` written as tmp_path/config.json."""
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return {
        "step": ["step", "--config", str(path), "--tokens", "64"],
        "plan --step": ["plan", "--step", "--config", str(path), "--budget", "1GiB"],
    }[command]


@pytest.mark.parametrize("command", ["step", "plan --step"])
@pytest.mark.parametrize("what", sorted(MULTIMODAL))
def test_a_config_whose_sizes_the_step_would_not_read_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    pytest.importorskip("transformers")
    data, says, hint = MULTIMODAL[what]
    err = one_line(*run_cli(*_stepping(tmp_path, data, command)))
    assert says in err and hint in err and "meta" not in err, err


@pytest.mark.parametrize(
    "data",
    [
        {"model_type": "gemma3_text", **TEXT},
        {"model_type": "llama", **TEXT, "text_config": None},
    ],
    ids=["gemma3's text model", "llama with a null text_config"],
)
def test_a_text_models_config_is_still_stepped(
    run_cli: Any, tmp_path: Path, data: dict[str, Any]
) -> None:
    import json

    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(data))
    code, out, err = run_cli("step", "--config", str(tmp_path / "config.json"), "--tokens", "64")
    assert code == 0, err
    assert f"{data['model_type']}, 1" in out and "B parameters" not in out.split("\n")[0], out


# -- a sequence longer than the positions a model learned (GPT-2's n_positions, OPT's
# max_position_embeddings): on meta no index is read, so a GPT-2 of 8 positions was
# simulated at 64 tokens and its peak printed, where a real step fails at the table's end

POSITIONS = {
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512},
    "opt": {"model_type": "opt", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 512, "ffn_dim": 128,
            "word_embed_proj_dim": 64},
    "gpt_bigcode": {"model_type": "gpt_bigcode", "n_embd": 64, "n_layer": 2, "n_head": 4,
                    "vocab_size": 512},
}  # fmt: skip
_POSITION_KEY = {"gpt2": "n_positions", "opt": "max_position_embeddings",
                 "gpt_bigcode": "n_positions"}  # fmt: skip


@pytest.mark.parametrize("positions", [8, 63])
@pytest.mark.parametrize("model", sorted(POSITIONS))
def test_tokens_past_the_learned_positions_are_refused(
    run_cli: Any, tmp_path: Path, model: str, positions: int
) -> None:
    import json

    pytest.importorskip("transformers")
    data = {**POSITIONS[model], _POSITION_KEY[model]: positions}
    (tmp_path / "config.json").write_text(json.dumps(data))
    out = tmp_path / "s.pickle"
    args = ["step", "--config", str(tmp_path / "config.json"), "--tokens", "64", "--out", str(out)]
    err = one_line(*run_cli(*args))
    assert f"the {model} model learned positions for {positions} tokens; a sequence of 64" in err
    assert f"give --tokens {positions} or fewer" in err and not out.exists()


@pytest.mark.parametrize(
    ("model", "positions"),
    [("gpt2", 64), ("opt", 64), ("gpt_bigcode", 100), ("llama", 8)],
    ids=["gpt2 at its 64", "opt at its 64", "gpt_bigcode below its 100", "llama (RoPE) past 8"],
)
def test_tokens_within_the_positions_or_of_computed_positions_are_stepped(
    run_cli: Any, tmp_path: Path, model: str, positions: int
) -> None:
    import json

    pytest.importorskip("transformers")
    from small_config import SMALL

    base = SMALL if model == "llama" else POSITIONS[model]
    key = "max_position_embeddings" if model == "llama" else _POSITION_KEY[model]
    (tmp_path / "config.json").write_text(json.dumps({**base, key: positions}))
    code, out, err = run_cli("step", "--config", str(tmp_path / "config.json"), "--tokens", "64")
    assert code == 0 and "peak allocated" in out, err


def test_learned_positions_reads_the_table_and_its_offset() -> None:
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from memprobe.profile.hf import learned_positions

    for model, expected in (("gpt2", 8), ("opt", 8)):
        config = AutoConfig.for_model(**{**POSITIONS[model], _POSITION_KEY[model]: 8})
        with torch.device("meta"):
            assert learned_positions(AutoModelForCausalLM.from_config(config)) == expected
    with torch.device("meta"):
        plain = torch.nn.Sequential(torch.nn.Embedding(4, 2))
    assert learned_positions(plain) is None


# -- a run whose snapshot records no allocation (segments only, as torch writes it without
# history; a trace emptied, or of segment events alone) or allocations of 0 bytes: its
# breakdown was a peak of 0 B, and the figure of such peaks ended `report` in matplotlib's
# ValueError (an empty legend), a traceback after two warnings on stderr


def _with_snapshot(made_run: Path, tmp_path: Path, change: Any) -> Path:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    snap = next((run / "snapshots").glob("*.pickle"))
    data = pickle.loads(snap.read_bytes())
    snap.write_bytes(pickle.dumps(change(data), protocol=4))
    return run


def _zero_byte_allocations(data: dict[str, Any]) -> dict[str, Any]:
    for entry in data["device_traces"][0]:
        if entry["action"] in ("alloc", "free_requested", "free_completed"):
            entry["size"] = 0
    return data


NO_ALLOCATION = {
    "torch's, segments only": lambda d: _segments_only(
        _segment(_block(EIGHT), _block(12 << 20, "inactive"))
    ),
    "memprobe's, its trace emptied": lambda d: {**d, "device_traces": [[]]},
    "segment events only": lambda d: {
        **d,
        "device_traces": [[e for e in d["device_traces"][0] if e["action"].startswith("seg")]],
    },
}


@pytest.mark.parametrize("what", sorted(NO_ALLOCATION))
def test_a_snapshot_of_no_allocation_is_not_drawn(
    run_cli: Any, made_run: Path, tmp_path: Path, what: str
) -> None:
    run = _with_snapshot(made_run, tmp_path, NO_ALLOCATION[what])
    page = tmp_path / "page.html"
    code, _, err = run_cli("report", str(run), "--out", str(page))
    assert code == 0 and not err.strip(), err
    html = page.read_text()
    assert "snapshot not used" in html and "records no allocation or free" in html
    assert not (tmp_path / "peak_breakdown.png").exists()


def test_allocations_of_no_bytes_draw_no_breakdown(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    run = _with_snapshot(made_run, tmp_path, _zero_byte_allocations)
    page = tmp_path / "page.html"
    code, _, err = run_cli("report", str(run), "--out", str(page))
    assert code == 0 and not err.strip(), err
    assert page.exists() and not (tmp_path / "peak_breakdown.png").exists()


@pytest.mark.parametrize("what", [*sorted(NO_ALLOCATION), "allocations of 0 bytes"])
def test_a_failing_gate_reads_such_a_snapshot_without_a_traceback(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    monkeypatch.chdir(tmp_path)
    change = NO_ALLOCATION.get(what, _zero_byte_allocations)
    run = _with_snapshot(made_run, tmp_path, change)
    rule = '{ kernel = "*", max_peak = "1 KiB" }'
    (tmp_path / "g.toml").write_text(f"[tool.memprobe.gate]\nrules = [{rule}]\n")
    code, out, err = run_cli("gate", str(run), "--config", "g.toml", "--junit-xml", "j.xml")
    assert code == 1 and "FAIL" in out and not err.strip(), (out, err)


# -- counts past 2^40 from a file, where every count flag stops: [tool.memprobe.sweep]
# tokens = [2^41] ran nine cases the CLI refuses (3,592 TiB peaks), 30 digits failed in
# torch's int64; a run.json planning them was resumed and measured alike

MAX = 2**40
SWEEP_COUNTS = {
    "tokens 2^40 + 1": ("tokens", MAX + 1, "'tokens' value 1,099,511,627,777 is beyond"),
    "tokens of 30 digits": ("tokens", 10**30, "'tokens' value of 31 digits is beyond"),
    "vocab 2^62": ("vocab", 2**62, "'vocab' value 4,611,686,018,427,387,904 is beyond"),
    "batch 2^41": ("batch", 2**41, "'batch' value 2,199,023,255,552 is beyond"),
    "chunk_size 2^41": ("chunk_size", 2**41, "'chunk_size' value 2,199,023,255,552"),
    "tp 2^41": ("tp", 2**41, "'tp' value 2,199,023,255,552"),
    "hidden 2^41": ("hidden", 2**41, "'hidden' value 2,199,023,255,552"),
}


@pytest.mark.parametrize("what", sorted(SWEEP_COUNTS))
def test_a_sweep_config_past_the_count_bound_is_refused_before_it_runs(
    run_cli: Any, here: Path, what: str
) -> None:
    key, value, says = SWEEP_COUNTS[what]
    grid = {"tokens": 64, "vocab": 128, key: value}
    lines = [f"{k} = [{v}]" for k, v in grid.items()]
    (here / "pyproject.toml").write_text(
        "[tool.memprobe.sweep]\n" + "\n".join(lines) + '\nkernel = ["local_chunked"]\n'
        '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 GiB" }]\n'
    )
    err = one_line(*run_cli("gate"))
    assert f"tool.memprobe.sweep: {says}" in err and "(1,099,511,627,776 = 2^40)" in err, err
    assert not (here / "reports").exists()


def test_a_sweep_config_at_the_count_bound_is_read(tmp_path: Path) -> None:
    from memprobe.config import load_config

    path = tmp_path / "pyproject.toml"
    path.write_text(f"[tool.memprobe.sweep]\ntokens = [{MAX}]\nvocab = [{MAX}]\n")
    grid = load_config(path).sweep
    assert grid is not None and grid.tokens == (MAX,) and grid.vocab == (MAX,)


@pytest.mark.parametrize(
    ("field", "value"),
    [("tokens", MAX + 1), ("vocab", 2**62), ("chunk_size", 2**62), ("batch", 2**41),
     ("cp", 2**41)],
)  # fmt: skip
def test_resume_refuses_a_planned_count_past_the_bound(
    run_cli: Any, made_run: Path, tmp_path: Path, field: str, value: int
) -> None:
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    meta = json.loads((run / "run.json").read_text())
    meta["cases"].append({**meta["cases"][0], "kernel": "local_chunked", field: value})
    (run / "run.json").write_text(json.dumps(meta))
    before = (run / "results.json").read_bytes()
    err = one_line(*run_cli("sweep", "--resume", str(run), "-q", "--no-verify"))
    assert f"which no sweep runs ({field} {value:,} is beyond the largest count" in err, err
    assert (run / "results.json").read_bytes() == before


# -- a model_type transformers does not know, quoted whole: one of a megabyte made the
# one line a megabyte long


@pytest.mark.parametrize(
    ("model_type", "shown"),
    [("x" * 1_000_000, "'" + "x" * 56 + "..."), ("llama\x1b[2J", "'llama\\x1b[2J'"),
     ("y" * 58, "'" + "y" * 58 + "'"), ("y" * 59, "'" + "y" * 56 + "...")],
    ids=["a megabyte", "an escape", "60 characters quoted", "61 characters quoted"],
)  # fmt: skip
def test_an_unknown_model_type_is_quoted_short(
    run_cli: Any, tmp_path: Path, model_type: str, shown: str
) -> None:
    import json

    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    err = one_line(*run_cli("step", "--config", str(tmp_path / "config.json"), "--tokens", "64"))
    assert f"unknown architecture {shown} (transformers" in err and len(err) < 400, err[:500]


# -- a pyproject.toml that is a link leading nowhere (dangling, or a loop): exists() follows
# it, so it was passed over as no file, and the rules of a pyproject.toml further up,
# another project's, gated this one


@pytest.mark.parametrize(
    ("target", "to"),
    [("missing.toml", "missing.toml"), ("pyproject.toml", "pyproject.toml"), ("a/b", "a/b")],
    ids=["dangling", "itself", "a missing folder"],
)
def test_a_pyproject_link_to_nothing_is_named_not_passed_over(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    target: str, to: str,
) -> None:  # fmt: skip
    outer = '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 KiB" }]\n'
    (tmp_path / "pyproject.toml").write_text(outer)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").symlink_to(target)
    monkeypatch.chdir(project)
    err = one_line(*run_cli("gate", str(made_run)))
    assert (
        f"config file {project / 'pyproject.toml'} is a link to {to}, which leads to no file" in err
    )
    assert "rules[0]" not in err


def test_a_config_link_to_nothing_is_named(run_cli: Any, made_run: Path, here: Path) -> None:
    (here / "g.toml").symlink_to("nowhere.toml")
    err = one_line(*run_cli("gate", str(made_run), "--config", "g.toml"))
    assert "config file g.toml is a link to nowhere.toml, which leads to no file" in err, err


def test_a_pyproject_link_to_a_config_is_read(
    run_cli: Any, made_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 KiB" }]\n'
    )
    project = tmp_path / "project"
    project.mkdir()
    (project / "real.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 GiB" }]\n'
    )
    (project / "pyproject.toml").symlink_to("real.toml")
    monkeypatch.chdir(project)
    code, out, err = run_cli("gate", str(made_run))
    assert code == 0 and f"rules from {project / 'pyproject.toml'}" in out, (out, err)


# -- diff --device N where one file has no device N: "the snapshot has nothing for device
# 5 (devices with data: 0)", where either of the two files may be "the snapshot"


@pytest.mark.parametrize("which", ["A", "B"])
def test_diff_names_the_file_without_the_device(run_cli: Any, tmp_path: Path, which: str) -> None:
    one = _write(tmp_path, _segments_only(_segment(_block(EIGHT), _block(12 << 20, "inactive"))))
    segments = [
        _segment(_block(2 << 20), total=2 << 20, device=d) | {"address": d << 30} for d in range(8)
    ]
    for segment in segments:
        for block in segment["blocks"]:
            block["address"] = segment["address"]
    many = _write(tmp_path, {"segments": segments, "device_traces": [[]] * 8}, "many.pickle")
    a, b = (one, many) if which == "A" else (many, one)
    err = one_line(*run_cli("diff", a, b, "--device", "5"))
    assert err.startswith(f"memprobe: error: {one}: the snapshot has nothing for device 5"), err
    code, out, err = run_cli("diff", many, many, "--device", "5")
    assert code == 0 and "peak: 2.00 MiB -> 2.00 MiB" in out, err


# -- one size under two names that disagree (GPT-2's n_embd is its hidden_size): n_embd 64
# and hidden_size 4096 built 405M parameters, the config's own n_embd passed over silently

GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512,
        "n_positions": 64}  # fmt: skip
TWO_NAMES = {
    "hidden_size 4096 beside n_embd 64": ({"hidden_size": 4096}, "n_embd 64 and hidden_size 4096"),
    "num_hidden_layers 3 beside n_layer 2": (
        {"num_hidden_layers": 3},
        "n_layer 2 and num_hidden_layers 3",
    ),
    "num_attention_heads 8 beside n_head 4": (
        {"num_attention_heads": 8},
        "n_head 4 and num_attention_heads 8",
    ),
    "hidden_size as text": ({"hidden_size": "x" * 100}, "n_embd 64 and hidden_size 'xxxx"),
}


@pytest.mark.parametrize("command", ["step", "plan --step"])
@pytest.mark.parametrize("what", sorted(TWO_NAMES))
def test_one_size_under_two_names_that_disagree_is_refused(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    pytest.importorskip("transformers")
    extra, says = TWO_NAMES[what]
    err = one_line(*run_cli(*_stepping(tmp_path, {**GPT2, **extra}, command)))
    assert f"the gpt2 config gives {says}" in err and "two names for one size" in err, err
    assert len(err) < 300, err


def test_one_size_under_two_names_that_agree_is_stepped(run_cli: Any, tmp_path: Path) -> None:
    import json

    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps({**GPT2, "hidden_size": 64, "n_layer": 2}))
    code, out, err = run_cli("step", "--config", str(tmp_path / "config.json"), "--tokens", "64")
    assert code == 0 and "gpt2, 136,960 parameters" in out, err


# -- a config's baseline written from the home folder ("~/base.json"): joined as written it
# named a folder "~" beside the config, and the line's own hint (`--update-baseline
# ~/base.json`, which the shell expands) made a baseline the gate then never read


@pytest.mark.parametrize("where", ["--config", "pyproject.toml"])
def test_a_baseline_from_the_home_folder_is_read_there(
    run_cli: Any, made_run: Path, here: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    import shutil

    home = here / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    name = "g.toml" if where == "--config" else "pyproject.toml"
    (here / name).write_text('[tool.memprobe.gate]\nbaseline = "~/base.json"\n')
    args = ["gate", str(made_run), *(["--config", name] if where == "--config" else [])]
    err = one_line(*run_cli(*args))
    assert f"baseline {home / 'base.json'} does not exist yet" in err, err
    assert f"--update-baseline {home / 'base.json'}`" in err
    shutil.copy(made_run / "results.json", home / "base.json")
    code, out, err = run_cli(*args)
    assert code == 0 and f"baseline {home / 'base.json'}" in out, (out, err)
    assert not (here / "~").exists()


# -- a folder whose config.json is a link to itself: "--config: no config.json in DIR",
# though one is there (exists() follows the link)


def test_a_config_json_link_loop_is_named_for_what_it_is(run_cli: Any, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "config.json").symlink_to("config.json")
    err = one_line(*run_cli("step", "--config", str(tmp_path), "--tokens", "64"))
    assert f"cannot read --config {tmp_path / 'config.json'}: Too many levels" in err, err
    assert "no config.json in" not in err
