"""The sharded step: FSDP2 (and context parallel) simulated as rank 0 of a fake world.

The exactness check runs real FSDP2 on two gloo ranks on the cpu (``multiprocess``) and
compares each rank's peaks with the fake-world simulation."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from launch import fork_ranks

pytest.importorskip("transformers")

from memprobe.profile.hf import config_from_dict  # noqa: E402
from memprobe.profile.sharded import ShardedHFStep, Sharding  # noqa: E402
from memprobe.profile.step import (  # noqa: E402
    COMMUNICATION,
    CP_KV,
    GRADIENTS,
    OPTIMIZER_STATE,
    PARAMETERS,
    UNSHARDED,
    simulate_step,
    trace_hf_step,
)

# One layer keeps the simulation to a few seconds; V = 1000 is not a multiple of 3 or 4
# ranks' shards of H, so FSDP2 pads.
H, V = 64, 1000
CONFIG = {
    "model_type": "llama",
    "hidden_size": H,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": V,
}


def _step(ranks: int = 4, cp: int = 1, **options: Any) -> ShardedHFStep:
    sharding = Sharding(
        fsdp=ranks,
        cp=cp,
        mp_reduce="fp32",
        mp_output=options.pop("mp_output", "fp32"),
        reshard_after_forward=options.pop("reshard", True),
    )
    kwargs: dict[str, Any] = {"tokens": 32, "chunk_size": 16, "dtype": "bf16"}
    kwargs.update(param_dtype="fp32", **options)
    return ShardedHFStep(config_from_dict(dict(CONFIG)), sharding=sharding, **kwargs)


@pytest.fixture(scope="module")
def three_ranks() -> Any:
    return simulate_step(_step(ranks=3))


def test_parameters_gradients_and_adam_state_are_one_nth_plus_padding(three_ranks: Any) -> None:
    result = three_ranks
    s = result.sharded
    per_rank = s["rank_parameter_bytes"]
    # FSDP2 pads dim 0 of every parameter to a multiple of the ranks (float32 shards).
    shapes = [(V, H), (4 * 16, H), (2 * 16, H), (2 * 16, H), (H, 4 * 16)]
    shapes += [(128, H), (128, H), (H, 128), (H,), (H,), (H,), (V, H)]
    padded = sum(math.ceil(s0 / 3) * math.prod(rest) * 4 for s0, *rest in shapes)
    assert per_rank == padded
    assert s["unsharded_parameter_bytes"] == result.parameters * 4
    assert s["padding_bytes"] == per_rank - result.parameters * 4 // 3 > 0
    at_peak = result.bytes_by_category
    assert at_peak[PARAMETERS] >= per_rank  # + the rotary buffer
    if result.peak_phase == "optimizer":
        assert at_peak[GRADIENTS] == per_rank
    # AdamW's two moments, sharded: live at the peak whatever its phase (every step after
    # the first holds them through forward and backward).
    assert at_peak[OPTIMIZER_STATE] == 2 * per_rank
    assert sum(at_peak.values()) == result.peak_allocated_bytes


def test_fsdp_buffers_have_their_own_categories(three_ranks: Any) -> None:
    """The all-gather of the [norm, lm_head] unit is one flat bf16 buffer of 3 ranks'
    padded shards; its unsharded parameters are V x H + H in bf16."""
    step = _step(ranks=3)
    tracked, _ = trace_hf_step(step)
    allocs = [e for e in tracked.events if e.action == "alloc"]
    comm = [e for e in allocs if step.category_of(e) == COMMUNICATION]
    unsharded = [e for e in allocs if step.category_of(e) == UNSHARDED]
    head_shard = math.ceil(V / 3) * H + math.ceil(H / 3)
    assert max(e.nbytes for e in comm if e.phase == "forward") == 3 * head_shard * 2
    assert {"forward", "backward"} <= {e.phase for e in unsharded}
    assert math.ceil(V / 3) * 3 * H * 2 in {e.nbytes for e in unsharded}  # padded rows
    # The reduce-scatter input: the unit's padded gradients in float32 (--mp-reduce).
    assert 3 * head_shard * 4 in {e.nbytes for e in comm if e.phase == "backward"}


def test_reshard_after_forward_false_keeps_every_unit_gathered() -> None:
    on = simulate_step(_step(ranks=2, optimizer="none"))
    off = simulate_step(_step(ranks=2, optimizer="none", reshard=False))
    assert off.phase_peaks["forward"] > on.phase_peaks["forward"]


def test_mp_output_fp32_stores_float32_unit_outputs() -> None:
    """output_dtype=float32: the decoder layer's output [1, S, H] and the logits
    [1, S, V] are cast to float32; without it the logits stay bf16 (the kernel makes
    float32 chunks only)."""

    def forward_dtypes(mp_output: str | None) -> set[tuple[tuple[int, ...], str]]:
        result = simulate_step(_step(ranks=2, optimizer="none", mp_output=mp_output))
        shapes = {(1, 32, H), (1, 32, V)}
        return {
            (e.shape, e.dtype)
            for e in result.events
            if e.action == "alloc" and e.phase == "forward" and e.shape in shapes
        }

    fp32 = forward_dtypes("fp32")
    assert {((1, 32, H), "torch.float32"), ((1, 32, V), "torch.float32")} <= fp32
    assert ((1, 32, V), "torch.float32") not in forward_dtypes(None)


def test_context_parallel_gathers_k_and_v_over_the_cp_ranks() -> None:
    step = _step(ranks=1, cp=4)
    tracked, _ = trace_hf_step(step)
    kv = [e for e in tracked.events if e.action == "alloc" and step.category_of(e) == CP_KV]
    # [B, kv heads, cp x tokens, head dim] in bf16, for K and for V.
    assert [e.shape for e in kv] == [(1, 2, 4 * 32, 16)] * 2
    assert step.sharded_summary()["sequence_tokens"] == 4 * 32  # type: ignore[index]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--mp-output", "fp32"], "are FSDP2's"),
        (["--mp-param", "bf16"], "--mp-param is FSDP2's"),
        (["--fsdp", "2", "--reshard-after-forward", "maybe"], "is not true or false"),
        (["--fsdp", "2", "--mp-output", "bf16"], "--mp-output 'bf16' is not one of"),
        (["--fsdp", "2", "--device", "cpu"], "No such option"),
    ],
)
def test_what_cannot_be_simulated_is_one_line(
    run_cli: Any, tmp_path: Path, flags: list[str], expected: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    code, _, err = run_cli("step", "--config", str(path), "--tokens", "8", *flags)
    assert code == 2
    assert expected in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--vocab", "1000", "--fsdp", "2"], "add --step --config CONFIG"),
        (["--vocab", "1000", "--mp-output", "fp32"], "add --step --config CONFIG"),
        (["--step", "CONFIG", "--fsdp", "2", "--tp", "3"], "--tp 3 does not divide"),
        (["--step", "CONFIG", "--fsdp", "2", "--tp", "2,4"], "--tp takes one value"),
        (["--step", "CONFIG", "--fsdp", "2", "--cp", "2,4"], "--cp takes one value"),
    ],
)
def test_plan_step_takes_the_same_flags(
    run_cli: Any, tmp_path: Path, flags: list[str], expected: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    flags = [f for flag in flags for f in (["--config", str(path)] if flag == "CONFIG" else [flag])]
    code, _, err = run_cli("plan", "--budget", "1GiB", *flags)
    assert code == 2
    assert expected in err
    assert "Traceback" not in err


def test_cli_prints_the_layout_and_the_arithmetic(run_cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    args = ["step", "--config", str(path), "--tokens", "32", "--fsdp", "2", "--cp", "2"]
    code, text, err = run_cli(*args, "--mp-param", "bf16", "--mp-output", "fp32")
    assert code == 0, err
    assert "sharded: rank 0 of 4 (FSDP 2 x CP 2: a 64-token sequence)" in text
    assert "FSDP2 shards over 4 ranks" in text
    assert "parameters per rank" in text
    code, text, err = run_cli(*args, "--json")
    assert code == 0, err
    assert json.loads(text)["sharded"]["shard_ranks"] == 4


# -- exactness: real FSDP2 on two gloo ranks --------------------------------------------


def _gloo_rank(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        tracked, _ = trace_hf_step(_step(ranks=2), "cpu", attention="cpu")
        Path(f"{out}.{rank}").write_text(
            json.dumps({"peak": tracked.peak_bytes, "phases": tracked.phase_peaks})
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess
def test_two_real_gloo_ranks_peak_at_the_simulated_bytes(tmp_path: Path) -> None:
    """Each real rank's peak and phase peaks equal rank 0 of the fake world to the byte
    (attention routed as the cpu runs it; the real run's only extra allocations are the
    kernels' 8-byte target-range checks, which the fake world skips)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    fork_ranks(_gloo_rank, 2, (str(tmp_path / "store"), str(tmp_path / "out")))
    real = [json.loads((tmp_path / f"out.{rank}").read_text()) for rank in range(2)]
    simulated, _ = trace_hf_step(_step(ranks=2), "meta", attention="cpu")
    for rank in real:
        assert rank["peak"] == simulated.peak_bytes
        assert rank["phases"] == simulated.phase_peaks


def test_plan_step_progress_says_the_unit_its_header_says(run_cli: Any, tmp_path: Path) -> None:
    """Sharded, the header counts tokens per GPU (under --cp, a share of the sequence):
    the per-kernel progress line on stderr said tokens/sequence."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    args = ["plan", "--step", "--config", str(path), "--budget", "16MiB", "--no-reserved"]
    code, out, err = run_cli(*args, "--kernel", "local_chunked", "--fsdp", "2", "--cp", "2")
    assert code == 0, err
    assert "tokens per GPU" in out
    assert err.startswith("[1/1] local_chunked: ") and err.rstrip().endswith(" tokens/GPU")
