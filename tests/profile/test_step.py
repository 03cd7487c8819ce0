"""``memprobe step`` and ``plan --step``: a Hugging Face model's whole training step from its
config, on meta. Configs are built in code (no downloads); the same step run for real on
cpu at small shapes equals the meta simulation to the byte."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from memprobe.attribute import attribute  # noqa: E402
from memprobe.errors import UserError  # noqa: E402
from memprobe.profile.hf import HFStep, config_from_dict, load_config  # noqa: E402
from memprobe.profile.step import (  # noqa: E402
    CHECKPOINTED,
    GRADIENTS,
    LOGPROB,
    OPTIMIZER_STATE,
    PARAMETERS,
    simulate_step,
    trace_hf_step,
)
from memprobe.snapshot.load import load_snapshot  # noqa: E402

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 512}
CONFIGS: dict[str, dict[str, Any]] = {
    # Grouped-query attention (4 query heads, 2 key/value heads).
    "llama": {"model_type": "llama", **SMALL, "num_attention_heads": 4, "num_key_value_heads": 2},
    "qwen2": {"model_type": "qwen2", **SMALL, "num_attention_heads": 4, "num_key_value_heads": 2},
    "mistral": {
        "model_type": "mistral",
        **SMALL,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "sliding_window": None,
    },
}


def _step(name: str = "llama", **kwargs: Any) -> HFStep:
    options: dict[str, Any] = {"tokens": 64, "chunk_size": 16, **kwargs}
    return HFStep(config_from_dict(dict(CONFIGS[name])), **options)


def _live(tracked: Any) -> list[tuple[Any, ...]]:
    return sorted((e.nbytes, e.op, e.shape, e.dtype, e.phase) for e in tracked.live_at_peak())


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("llama", {}),
        ("qwen2", {"checkpointing": True}),
        ("mistral", {"kernel": "fused_linear_chunked", "attn": "eager", "param_dtype": "fp32"}),
    ],
)
def test_meta_equals_a_real_cpu_step_to_the_byte(name: str, options: dict[str, Any]) -> None:
    """Attention routed as cpu runs it (the fused CPU kernel) makes meta comparable. (The
    event lists differ in a few tiny host-side tensors: the rotary frequencies, the
    kernels' 8-byte target-range check that meta skips.)"""
    step = _step(name, **options)
    meta, _ = trace_hf_step(step, "meta", attention="cpu")
    cpu, _ = trace_hf_step(step, "cpu")
    assert meta.peak_bytes == cpu.peak_bytes > 0
    assert meta.phase_peaks == cpu.phase_peaks
    assert _live(meta) == _live(cpu)


def test_breakdown_accounts_for_every_byte_at_the_peak() -> None:
    result = simulate_step(_step(checkpointing=True))
    assert sum(result.bytes_by_category.values()) == result.peak_allocated_bytes
    params = result.parameters * 2  # bf16
    assert result.bytes_by_category[PARAMETERS] >= params  # + the rotary buffers
    assert result.bytes_by_category[GRADIENTS] == params
    assert result.bytes_by_category[OPTIMIZER_STATE] == 2 * params  # AdamW: m and v
    assert result.peak_phase == "optimizer"


def test_the_logprob_steps_share_is_its_float32_blocks() -> None:
    """Where the logits dominate (V large, no optimizer), the unchunked kernel's peak holds
    float32 [B,S,V] blocks inside its window; local_chunked holds at most one chunk."""
    big_vocab = {"vocab_size": 8192, "num_hidden_layers": 1}
    cfg = config_from_dict({**CONFIGS["llama"], **big_vocab})
    tokens = 256
    fp32_block = 4 * tokens * 8192
    unchunked = simulate_step(HFStep(cfg, tokens=tokens, kernel="unchunked", optimizer="none"))
    chunked = simulate_step(
        HFStep(cfg, tokens=tokens, kernel="local_chunked", chunk_size=32, optimizer="none")
    )
    assert unchunked.peak_phase == "backward"
    assert unchunked.logprob_bytes >= 2 * fp32_block
    assert unchunked.logprob_working_bytes >= 2 * fp32_block
    assert chunked.logprob_working_bytes < fp32_block
    assert chunked.peak_allocated_bytes < unchunked.peak_allocated_bytes - fp32_block
    assert LOGPROB in unchunked.bytes_by_category


def test_a_gradient_at_a_reused_address_is_not_the_logits_gradient() -> None:
    """Storage keys are addresses: once the logits' gradient is freed, a parameter's
    gradient may be made at its key. The peak here is in the loss's backward, before any
    parameter has a gradient, so nothing live at it is a gradient: the logits' gradient
    belongs to the logprob step (it read "gradients" when the later key was trusted)."""
    cfg = config_from_dict({**CONFIGS["llama"], "vocab_size": 8192, "num_hidden_layers": 1})
    result = simulate_step(HFStep(cfg, tokens=256, kernel="local_chunked", chunk_size=32))
    logits_grad = 256 * 8192 * 2  # bf16 [1, 256, V]
    assert result.peak_phase == "backward"
    assert GRADIENTS not in result.bytes_by_category
    assert result.bytes_by_category[LOGPROB] >= logits_grad
    assert sum(result.bytes_by_category.values()) == result.peak_allocated_bytes


def _scores(result: Any, tokens: int) -> list[Any]:
    return [e for e in result.events if len(e.shape) == 4 and e.shape[-2:] == (tokens, tokens)]


def test_attention_runs_what_cuda_would_pick_on_meta() -> None:
    tokens = 96
    flash = simulate_step(_step(tokens=tokens))
    assert flash.attention == {"flash": 2}
    assert "flash attention" in flash.attention_words
    # fp32 has no flash kernel: memory-efficient attention (equal head counts).
    efficient = simulate_step(_step("mistral", tokens=tokens, dtype="fp32"))
    assert efficient.attention == {"efficient": 2}
    math = simulate_step(_step(tokens=tokens, attn="sdpa-math"))
    assert math.attention == {"math": 2}
    assert _scores(math, tokens)  # [B, h, S, S]
    assert not _scores(flash, tokens) and not _scores(efficient, tokens)
    assert math.peak_allocated_bytes > flash.peak_allocated_bytes


def test_checkpointing_keeps_layer_inputs_not_activations() -> None:
    cfg = config_from_dict({**CONFIGS["llama"], "vocab_size": 64})
    on = simulate_step(HFStep(cfg, tokens=512, checkpointing=True, optimizer="none"))
    off = simulate_step(HFStep(cfg, tokens=512, optimizer="none"))
    assert on.attention == {"flash": 4}  # forward and its recomputation
    assert off.attention == {"flash": 2}
    assert on.peak_allocated_bytes < off.peak_allocated_bytes
    assert CHECKPOINTED not in off.bytes_by_category


def test_equals_torchs_mem_tracker_under_fake_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    mem_tracker = pytest.importorskip(
        "torch.distributed._tools.mem_tracker", reason="this torch has no MemTracker"
    )
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import memprobe.kernels._checks as checks

    # Fake tensors refuse reads of values: no target-range check there.
    monkeypatch.setattr(checks, "_check_target_range", lambda targets, vocab: None)
    step = _step(kernel="unchunked", optimizer="sgd")
    device = torch.device("cpu")
    with FakeTensorMode():
        tracker = mem_tracker.MemTracker()
        with tracker:
            step(device)
        theirs = tracker.get_tracker_snapshot("peak")[device]["Total"]
    assert trace_hf_step(step, "meta", attention="cpu")[0].peak_bytes == theirs


def test_config_file_and_directory_both_load(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["qwen2"]))
    assert load_config(tmp_path).model_type == "qwen2"
    assert load_config(tmp_path / "config.json").num_key_value_heads == 2


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"model_type": "no_such_arch"}, "unknown architecture 'no_such_arch'"),
        ({"model_type": "bert_generation_x"}, "unknown architecture"),
        ({"hidden_size": 3}, "has no model_type"),
        ({"model_type": "clip"}, "has no causal-LM model"),
    ],
)
def test_bad_configs_are_one_line(tmp_path: Path, run_cli: Any, data: Any, expected: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    code, out, err = run_cli("step", "--config", str(path), "--tokens", "8")
    assert code == 2, (out, err)
    assert expected in err and err.count("\n") == 1 and "Traceback" not in err


def test_without_transformers_says_how_to_install(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["llama"]))
    monkeypatch.setitem(sys.modules, "transformers", None)  # import raises ImportError
    code, _, err = run_cli("step", "--config", str(tmp_path), "--tokens", "8")
    assert code == 2
    assert "pip install 'memprobe[hf]'" in err and err.count("\n") == 1


def test_bad_flags_are_one_line() -> None:
    cfg = config_from_dict(dict(CONFIGS["llama"]))
    for kwargs, expected in (
        ({"optimizer": "lamb"}, "--optimizer 'lamb'"),
        ({"attn": "flash"}, "--attn 'flash'"),
        ({"dtype": "int8"}, "--dtype 'int8'"),
        ({"kernel": "distributed"}, "shards the vocabulary"),
        ({"kernel": "nope"}, "unknown kernel"),
        ({"dtype": "bf16", "param_dtype": "fp16"}, "only fp32 master weights"),
    ):
        with pytest.raises(UserError, match=expected):
            HFStep(cfg, tokens=8, **kwargs)


def test_cli_prints_the_breakdown_and_writes_a_snapshot(run_cli: Any, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["llama"]))
    out = tmp_path / "step.pickle"
    args = ("step", "--config", str(tmp_path), "--tokens", "64", "--chunk-size", "16")
    code, text, err = run_cli(*args, "--budget", "1MiB", "--out", str(out))
    assert code == 0, err
    assert "attention: flash attention (CUDA's choice" in text
    assert "budget 1.00 MiB: does not fit" in text
    assert f"wrote {out}" in text
    found = attribute(load_snapshot(out))
    code, text, err = run_cli(*args, "--json")
    data = json.loads(text)
    assert found.peak_allocated_bytes == data["peak_allocated_bytes"]
    assert data["fits_reserved"] is None
    assert sum(data["bytes_by_category"].values()) == data["peak_allocated_bytes"]
    code, _, err = run_cli(*args, "--fused", "--kernel", "unchunked")
    assert code == 2 and "--fused and --kernel" in err


def test_plan_step_is_the_plan_search_on_the_whole_step(run_cli: Any, tmp_path: Path) -> None:
    """The answer T fits the budget and T + 1 does not, each checked by its own step."""
    config = {**CONFIGS["llama"], "num_hidden_layers": 1, "vocab_size": 1024}
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ("plan", "--step", "--config", str(tmp_path), "--budget", "8MiB")
    code, text, err = run_cli(
        *args, "--kernel", "unchunked", "--optimizer", "sgd", "--no-reserved", "--json"
    )
    assert code == 0, err
    (row,) = json.loads(text)
    tokens = row["max_tokens"]
    assert row["kernel"] == "unchunked" and tokens > 0
    cfg = config_from_dict(dict(config))
    fits = simulate_step(HFStep(cfg, tokens=tokens, kernel="unchunked", optimizer="sgd"))
    over = simulate_step(HFStep(cfg, tokens=tokens + 1, kernel="unchunked", optimizer="sgd"))
    assert fits.peak_allocated_bytes == row["peak_bytes_at_max"] <= 8 * 2**20
    assert over.peak_allocated_bytes > 8 * 2**20
    assert row["reserved_max_tokens"] is None
    code, _, err = run_cli("plan", "--config", str(tmp_path), "--budget", "8MiB")
    assert code == 2 and "which --step asks for (add --step" in err


def test_a_chunked_losss_trace_is_not_read_as_forward_only(run_cli: Any, tmp_path: Path) -> None:
    """local_chunked never makes [N, V] loss blocks, but the step ran backward: attribute
    must not call it a forward-only trace, and --what-if finds it by the kernel's frames."""
    # Large enough for the lm_head's [N, V] output to be read (at SMALL nothing is claimed).
    config = {**CONFIGS["llama"], "hidden_size": 256, "intermediate_size": 688,
              "vocab_size": 32000}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = tmp_path / "step.pickle"
    code, _, err = run_cli("step", "--config", str(tmp_path), "--tokens", "2048",
                           "--out", str(out))  # fmt: skip
    assert code == 0, err
    code, text, err = run_cli("attribute", str(out))
    assert code == 0, err
    assert "(forward only, no loss)" not in text
    assert "a backward ran, but no loss over [N, V]" in text
    # memprobe's own kernel is found by its frames: --what-if swaps it.
    code, text, err = run_cli("attribute", str(out), "--what-if", "local_tiled")
    assert code == 0, err
    assert "what-if local_tiled: the loss step" in text
