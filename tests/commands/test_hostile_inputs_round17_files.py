"""Hostile inputs, round 17, files a user hands memprobe: a model config.json whose
architecture's own sizes cannot be built, run directories whose results.json is a link
leading nowhere, and snapshots with bytes past their pickle. Each table is a variant of a
defect class the pass found: one line and exit 2 that says what is wrong, never a step
blamed on meta, a run re-made over a user's link, or a number read from half a file."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

# -- a config.json size of the architecture's own (not one of the sizes every model has)
# below 0, or an MoE routing each token to 0 of its experts: transformers builds either;
# the step failed on meta ("try --device cpu", a flag step has not) or printed the peak of
# a model whose MoE layers pass nothing on. An MoE of 0 experts that still fails on meta
# now names the config, not meta.

SMALL = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
}  # fmt: skip
MIXTRAL = {**SMALL, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
QWEN_MOE = {
    **SMALL, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
}  # fmt: skip
DEEPSEEK = {
    **SMALL, "model_type": "deepseek_v3", "num_key_value_heads": 4, "q_lora_rank": 16,
    "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
}  # fmt: skip
MIXTRAL_DEFAULT_EXPERTS = {k: v for k, v in MIXTRAL.items() if k != "num_local_experts"}

UNBUILDABLE = {
    "mixtral, -1 experts per token": (
        {**MIXTRAL, "num_experts_per_tok": -1},
        "'num_experts_per_tok' is -1: a size is 0 or more",
    ),
    "deepseek_v3, kv_lora_rank -5": (
        {**DEEPSEEK, "kv_lora_rank": -5},
        "'kv_lora_rank' is -5: a size is 0 or more",
    ),
    "qwen2_moe, moe_intermediate_size -1": (
        {**QWEN_MOE, "moe_intermediate_size": -1},
        "'moe_intermediate_size' is -1",
    ),
    "mixtral, 0 experts per token of 4": (
        {**MIXTRAL, "num_experts_per_tok": 0},
        "num_experts_per_tok is 0: its MoE layers route each token to no expert",
    ),
    "mixtral, 0 per token of its default 8": (
        {**MIXTRAL_DEFAULT_EXPERTS, "num_experts_per_tok": 0},
        "num_experts_per_tok is 0",
    ),
    "qwen2_moe, 0 experts per token of 4": (
        {**QWEN_MOE, "num_experts_per_tok": 0},
        "num_experts_per_tok is 0",
    ),
    "mixtral, 0 experts and 0 per token": (
        {**MIXTRAL, "num_local_experts": 0, "num_experts_per_tok": 0},
        "the model built from config.json cannot run this op: check the config's sizes",
    ),
}


def _step_args(tmp_path: Path, config: dict[str, Any], command: str) -> list[str]:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return {
        "step": ["step", "--config", str(tmp_path), "--tokens", "16"],
        "plan --step": ["plan", "--step", "--config", str(tmp_path), "--budget", "1GiB"],
    }[command]


@pytest.mark.parametrize("command", ["step", "plan --step"])
@pytest.mark.parametrize("what", sorted(UNBUILDABLE))
def test_a_size_the_architecture_cannot_build_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    config, says = UNBUILDABLE[what]
    err = one_line(*run_cli(*_step_args(tmp_path, config, command)))
    assert says in err and "--device" not in err, err


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({**QWEN_MOE, "num_experts": 0, "num_experts_per_tok": 0}, id="dense"),
        pytest.param({**DEEPSEEK, "q_lora_rank": 0}, id="deepseek_v3, q_lora_rank 0"),
    ],
)
def test_an_architecture_of_zero_sized_parts_is_still_stepped(
    run_cli: Any, tmp_path: Path, config: dict[str, Any]
) -> None:
    code, out, err = run_cli(*_step_args(tmp_path, config, "step"))
    assert code == 0 and "peak allocated" in out, err


# -- a run directory's results.json that is a link leading nowhere (dangling, or a loop):
# round 15 named it for gate, report and plan --from-run; gate --baseline RUN called the
# run "a folder with no results.json in it", and sweep --resume took it for no results:
# it ran every case again and replaced the user's link with a file.


def _linked(made_run: Path, here: Path, to: str) -> Path:
    run = here / "run"
    shutil.copytree(made_run, run)
    (run / "results.json").unlink()
    (run / "results.json").symlink_to(to)
    return run


@pytest.mark.parametrize("to", ["gone.json", "results.json"], ids=["dangling", "a loop"])
@pytest.mark.parametrize("command", ["gate --baseline", "sweep --resume"])
def test_a_run_dirs_results_link_to_nothing_is_named(
    run_cli: Any, made_run: Path, here: Path, to: str, command: str
) -> None:
    run = _linked(made_run, here, to)
    args = {
        "gate --baseline": ["gate", str(made_run), "--baseline", str(run)],
        "sweep --resume": ["sweep", "--resume", str(run), "-q", "--no-verify"],
    }[command]
    err = one_line(*run_cli(*args))
    assert f"{run / 'results.json'} is a link to {to}, which leads to no file" in err, err
    assert (run / "results.json").is_symlink()


@pytest.mark.parametrize("command", ["gate --baseline", "sweep --resume"])
def test_a_run_dirs_results_link_to_a_file_is_read(
    run_cli: Any, made_run: Path, here: Path, command: str
) -> None:
    # A copy of made_run's results: the gated run itself as its own baseline is refused.
    shutil.copy(made_run / "results.json", here / "copy.json")
    run = _linked(made_run, here, str(here / "copy.json"))
    args = {
        "gate --baseline": ["gate", str(made_run), "--baseline", str(run)],
        "sweep --resume": ["sweep", "--resume", str(run), "-q", "--no-verify"],
    }[command]
    code, _, err = run_cli(*args)
    assert code == 0, err


# -- a snapshot with bytes after its pickle ends: the unpickler stops at the first STOP,
# so two snapshots joined (cat rank0.pickle rank1.pickle) read as the first alone, its
# numbers printed as the file's. A truncated file was refused; a longer one is too.

SNAPSHOT = {
    "segments": [],
    "device_traces": [
        [
            {"action": "alloc", "addr": 0x7F00_0000_0000, "size": 1 << 20, "stream": 0},
            {"action": "free_requested", "addr": 0x7F00_0000_0000, "size": 1 << 20, "stream": 0},
        ]
    ],
}


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(pickle.dumps(SNAPSHOT, protocol=4), id="a second snapshot"),
        pytest.param(b"\n", id="one newline"),
        pytest.param(b"\x00" * 4096, id="zero padding"),
    ],
)
@pytest.mark.parametrize("command", ["attribute", "diff", "plan --other-from"])
def test_bytes_after_the_pickle_are_one_line(
    run_cli: Any, tmp_path: Path, tail: bytes, command: str
) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT, protocol=4) + tail)
    args = {
        "attribute": ["attribute", str(path)],
        "diff": ["diff", str(path), str(path)],
        "plan --other-from": [
            *("plan", "--other-from", str(path), "--budget", "1GiB", "--vocab", "128"),
        ],
    }[command]
    err = one_line(*run_cli(*args))
    assert f"holds {len(tail):,} bytes after its pickle ends" in err, err


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_whole_pickle_of_any_protocol_is_still_read(
    run_cli: Any, tmp_path: Path, protocol: int
) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT, protocol=protocol))
    code, out, err = run_cli("attribute", str(path))
    assert code == 0 and "peak allocated: 1.00 MiB" in out, err


# -- a block whose state torch never writes: neither live nor free, it was counted nowhere
# (an empty 2 MiB segment's largest free block read 0 B, its bytes in no total)


def _one_block(state: str) -> dict[str, Any]:
    block = {"address": 0x7F00_0000_0000, "size": 2 << 20, "requested_size": 0, "state": state}
    segment = {"device": 0, "address": 0x7F00_0000_0000, "total_size": 2 << 20, "stream": 0,
               "segment_type": "small", "blocks": [block]}  # fmt: skip
    return {"segments": [segment], "device_traces": [[]]}


@pytest.mark.parametrize(
    "state", ["weird", "ACTIVE_ALLOCATED", "inactive ", "", "active_allocated\x1b[2J"]
)
@pytest.mark.parametrize("command", ["attribute", "diff"])
def test_a_block_state_torch_never_writes_is_one_line(
    run_cli: Any, tmp_path: Path, state: str, command: str
) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_one_block(state)))
    args = [command, str(path)] + ([str(path)] if command == "diff" else [])
    err = one_line(*run_cli(*args))
    assert "blocks[0] has state" in err and "which torch never writes" in err, err
    assert "\x1b" not in err


@pytest.mark.parametrize("state", ["inactive", "active_allocated", "active_awaiting_free"])
def test_the_block_states_torch_writes_are_read(run_cli: Any, tmp_path: Path, state: str) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_one_block(state)))
    code, out, err = run_cli("attribute", str(path))
    assert code == 0 and "1 segment" in out, err


# -- a run's other file (results.csv, run.json, report.html) handed where its results.json
# goes: "the file is damaged or not memprobe's; re-run the sweep", of a whole run that
# needed only its results.json named


@pytest.mark.parametrize("name", ["results.csv", "run.json", "report.html"])
@pytest.mark.parametrize("command", ["gate", "gate --baseline"])
def test_a_runs_other_file_given_as_results_is_not_called_damaged(
    run_cli: Any, made_run: Path, here: Path, name: str, command: str
) -> None:
    (here / "g.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 GiB" }]\n'
    )
    given = str(made_run / name)
    args = {
        "gate": ["gate", given, "--config", "g.toml"],
        "gate --baseline": ["gate", str(made_run), "--baseline", given, "--config", "g.toml"],
    }[command]
    err = one_line(*run_cli(*args))
    assert f"{given} is not a memprobe results.json" in err, err
    assert "give a run directory or its results.json" in err and "re-run" not in err, err


def test_a_runs_results_json_that_is_no_results_is_still_called_damaged(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    run = here / "run"
    shutil.copytree(made_run, run)
    (run / "results.json").write_text("{}")
    err = one_line(*run_cli("report", str(run), "--out", str(here / "page.html")))
    assert "the file is damaged or not memprobe's; re-run the sweep" in err, err


# -- an empty string where a gate config names a kernel glob or the baseline: "must be a
# string" (or "a path string") of a value that is one


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ('rules = [{ kernel = "", max_peak = "1 GiB" }]', "rules[0]: 'kernel' is empty"),
        ('rules = [{ kernel = "*", max_peak = "1 GiB" }]\nbaseline = ""', "'baseline' is empty"),
        ('rules = [{ kernel = 5, max_peak = "1 GiB" }]', "'kernel' must be a string"),
        ('rules = [{ kernel = "*", max_peak = "1 GiB" }]\nbaseline = 5', "must be a path string"),
    ],
    ids=["an empty kernel", "an empty baseline", "a kernel number", "a baseline number"],
)
def test_an_empty_gate_value_is_called_empty(
    run_cli: Any, made_run: Path, here: Path, toml: str, says: str
) -> None:
    (here / "g.toml").write_text(f"[tool.memprobe.gate]\n{toml}\n")
    err = one_line(*run_cli("gate", str(made_run), "--config", "g.toml"))
    assert says in err, err


# -- memprobe's own "synthesized" mark read by truthiness: a string ("no", "False") made a
# real snapshot's segments "memprobe's model of the CUDA caching allocator" (round 16
# read a segment's expandable flag so; this is the same class in another field)


@pytest.mark.parametrize(
    ("mark", "noted"), [("no", False), ("False", False), (1, False), (True, True)]
)
def test_the_synthesized_mark_is_a_bool(
    run_cli: Any, tmp_path: Path, mark: object, noted: bool
) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({**SNAPSHOT, "memprobe": {"synthesized": mark}}))
    code, out, err = run_cli("attribute", str(path))
    assert code == 0, err
    assert ("synthesized by memprobe" in out) is noted, out


# -- an architecture transformers builds without SDPA attention (gemma2, bloom, gpt_neo):
# --attn auto asked for SDPA, the build failed, and the one line said to "check the
# config" of a whole config; plan --step, which has no --attn, could not plan it at all.
# auto now builds it eager, as transformers does by default; an explicit SDPA request
# says which --attn builds it. (plan --step builds the model the same way.)

GEMMA2 = {**SMALL, "model_type": "gemma2", "head_dim": 16, "sliding_window": 8}
BLOOM = {"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256}


@pytest.mark.parametrize("config", [GEMMA2, BLOOM], ids=["gemma2", "bloom"])
def test_an_architecture_without_sdpa_is_stepped_eager_under_auto(
    run_cli: Any, tmp_path: Path, config: dict[str, Any]
) -> None:
    code, out, err = run_cli(*_step_args(tmp_path, config, "step"))
    assert code == 0 and "attention: eager" in out, err


def test_sdpa_asked_of_an_architecture_without_it_is_one_line(run_cli: Any, tmp_path: Path) -> None:
    args = _step_args(tmp_path, GEMMA2, "step")
    err = one_line(*run_cli(*args, "--attn", "sdpa-math"))
    assert "gemma2 has no SDPA attention" in err and "use --attn eager" in err, err
    assert "check the config" not in err


# -- tied embeddings (gemma, qwen2 0.5B, llama 3.2 1B) under --fsdp or --cp: the embedding
# was an FSDP unit of its own and the lm_head sharing its weight fell to the root, and the
# step failed "on cpu" with FSDP2's error and "fix the step and rerun", of memprobe's step.
# The shared weight now stays in the root's group; its bytes are counted once.

LLAMA = {**SMALL, "model_type": "llama"}


@pytest.mark.parametrize("flags", [["--fsdp", "2"], ["--cp", "2"]], ids=["fsdp", "cp"])
def test_tied_embeddings_are_sharded_in_one_group(
    run_cli: Any, tmp_path: Path, flags: list[str]
) -> None:
    tied = _step_args(tmp_path, {**LLAMA, "tie_word_embeddings": True}, "step")
    code, out, err = run_cli(*tied, *flags)
    assert code == 0, err
    # The embedding's 256 x 64 bf16 weight once, not again as the lm_head's (208.62 KiB
    # untied), over 2 ranks.
    assert "parameters per rank 88.31 KiB = 176.62 KiB / 2" in out, out


# -- a sharded step (its fake world of ranks runs on cpu) that fails at an op: torch's fake
# tensors logged the failure as a 20-line traceback on stderr before the one line, and the
# line said to "fix the step and rerun", of memprobe's own step


def test_a_sharded_step_that_fails_at_an_op_is_one_line_naming_the_config(
    run_cli: Any, tmp_path: Path
) -> None:
    config = {**MIXTRAL, "num_local_experts": 0, "num_experts_per_tok": 0}
    err = one_line(*run_cli(*_step_args(tmp_path, config, "step"), "--fsdp", "2"))
    assert "at aten.histc" in err and "check the config's sizes" in err, err
    assert "fix the step" not in err
