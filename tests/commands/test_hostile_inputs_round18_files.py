"""Hostile inputs, round 18, files a user hands memprobe: a model config.json of an
architecture transformers builds as a causal LM whose forward reads a mask's values (a
config with a pad_token_id, the bart family's own all-ones mask), and an encoder-decoder
config whose causal LM (its decoder) has sizes of its own. Each table is a variant of a
defect class the pass found: the step of a whole config is simulated, one that cannot be
(an architecture that reads its tensors' values) says so, never a hint to check sizes that
were right, and no decoder is built of transformers' default sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

pytest.importorskip("transformers")

# -- a whole config of an architecture whose forward reads a value: gpt2 (or openai-gpt)
# given a pad_token_id checks whether the ids hold it, to warn; bart, marian, pegasus,
# biogpt make an all-ones attention mask and ask whether it is all ones (roformer and
# big_bird with .all()). On meta each was .item() on a meta tensor, and the step of a
# whole config failed "on meta" with a hint to check its sizes. The step's inputs hold no
# padding, so each answer is the GPU's: no padding, SDPA's mask skipped.

SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256}
BART = {
    "d_model": 64, "decoder_layers": 2, "decoder_attention_heads": 4, "decoder_ffn_dim": 128,
    "vocab_size": 256, "max_position_embeddings": 64, "pad_token_id": 1,
}  # fmt: skip
WHOLE = {
    "gpt2 with a pad_token_id": {
        "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256,
        "n_positions": 64, "pad_token_id": 0,
    },
    "openai-gpt with a pad_token_id": {
        "model_type": "openai-gpt", "n_embd": 64, "n_layer": 2, "n_head": 4,
        "vocab_size": 256, "n_positions": 64, "pad_token_id": 0,
    },
    "bart": {**BART, "model_type": "bart"},
    "pegasus": {**BART, "model_type": "pegasus"},
    "marian": {**BART, "model_type": "marian", "decoder_start_token_id": 0},
    "bart, sizes under the standard names too": {
        **BART, "model_type": "bart", "num_hidden_layers": 6, "num_attention_heads": 8,
    },
    "biogpt": {**SMALL, "model_type": "biogpt", "intermediate_size": 128,
               "max_position_embeddings": 64},
    "roformer (an all-ones mask read with .all())": {
        **SMALL, "model_type": "roformer", "intermediate_size": 128,
        "max_position_embeddings": 64, "pad_token_id": 0,
    },
}  # fmt: skip


def _config(tmp_path: Path, config: dict[str, Any]) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize("what", sorted(WHOLE))
def test_a_whole_config_whose_forward_reads_a_mask_is_stepped(
    run_cli: Any, tmp_path: Path, what: str
) -> None:
    args = ("step", "--config", _config(tmp_path, WHOLE[what]), "--tokens", "16")
    code, out, err = run_cli(*args)
    assert code == 0 and "peak allocated" in out, err


def test_plan_step_plans_one_to_its_learned_positions(run_cli: Any, tmp_path: Path) -> None:
    args = ("plan", "--step", "--config", _config(tmp_path, WHOLE["bart"]), "--budget", "64MiB")
    code, out, err = run_cli(*args, "--kernel", "local_chunked", "--json")
    assert code == 0 and json.loads(out)[0]["max_tokens"] == 64, err


@pytest.mark.parametrize("what", ["gpt2 with a pad_token_id", "bart"])
def test_meta_still_equals_a_real_cpu_step_to_the_byte(what: str) -> None:
    """The answers are the ones cpu computes from the values: the same peak. (Phase peaks
    differ on cpu where these models' LayerNorm keeps bf16 statistics, CUDA's float32.)"""
    from memprobe.profile.hf import HFStep, config_from_dict
    from memprobe.profile.step import trace_hf_step

    step = HFStep(config_from_dict(dict(WHOLE[what])), tokens=32, chunk_size=16)
    meta, _ = trace_hf_step(step, "meta", attention="cpu")
    cpu, _ = trace_hf_step(step, "cpu")
    assert meta.peak_bytes == cpu.peak_bytes > 0


# An architecture whose step reads values it cannot do without (JetMoE's expert sizes as
# a list, XLM's assert on its lengths) cannot be simulated: it says that, not "check the
# config's sizes".
READS_VALUES = {
    "jetmoe": {**SMALL, "model_type": "jetmoe", "intermediate_size": 128,
               "num_local_experts": 2, "num_experts_per_tok": 1, "kv_channels": 16},
    "xlm": {"model_type": "xlm", "emb_dim": 64, "n_layers": 2, "n_heads": 4,
            "vocab_size": 256, "max_position_embeddings": 64, "pad_index": 2},
}  # fmt: skip


@pytest.mark.parametrize("what", sorted(READS_VALUES))
def test_an_architecture_that_reads_values_says_so(run_cli: Any, tmp_path: Path, what: str) -> None:
    args = ("step", "--config", _config(tmp_path, READS_VALUES[what]), "--tokens", "16")
    err = one_line(*run_cli(*args))
    assert "reads its tensors' values during the step" in err, err
    assert "sizes" not in err, err


# -- an encoder-decoder's causal LM (bart, marian, pegasus, whisper) is its decoder, built
# from decoder_layers and decoder_attention_heads; the standard names map to its encoder.
# memprobe checked num_hidden_layers (the encoder's) and let the decoder's sizes go
# unchecked: a config of num_hidden_layers 2 built transformers' default 12-layer,
# 16-head decoder, and decoder_layers 100,000 built for minutes.

ENCODER_DECODER = {
    "bart, standard names only": (
        {**SMALL, "model_type": "bart"},
        "the bart config gives no decoder_layers (its causal LM is its decoder; "
        "num_hidden_layers is its encoder_layers)",
    ),
    "whisper, no decoder heads": (
        {"model_type": "whisper", "d_model": 64, "decoder_layers": 2, "vocab_size": 256},
        "the whisper config gives no decoder_attention_heads",
    ),
    "marian, decoder_layers 100,000": (
        {**BART, "model_type": "marian", "decoder_layers": 100_000},
        "the marian config's decoder_layers is 100000: a whole number from 1 to 1,024",
    ),
    "pegasus, decoder heads 0": (
        {**BART, "model_type": "pegasus", "decoder_attention_heads": 0},
        "the pegasus config's decoder_attention_heads is 0",
    ),
}


@pytest.mark.parametrize("command", ["step", "plan --step"])
@pytest.mark.parametrize("what", sorted(ENCODER_DECODER))
def test_an_encoder_decoders_decoder_sizes_are_checked(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    config, says = ENCODER_DECODER[what]
    path = _config(tmp_path, config)
    args = {
        "step": ("step", "--config", path, "--tokens", "16"),
        "plan --step": ("plan", "--step", "--config", path, "--budget", "1GiB"),
    }[command]
    err = one_line(*run_cli(*args))
    assert says in err, err


# -- an attention-free architecture (mamba, mamba2, rwkv, xlstm): its config.json gives no
# num_attention_heads, as it has none, and memprobe refused it for that ("memprobe does
# not fill them from transformers' defaults"); given a made-up one, the step said its
# attention was "eager ... [B,h,S,S] scores". With --fused, mamba's float32 residual
# stream met a bf16 lm_head and the step failed with a hint to check the config's sizes:
# the model's own head casts the hidden states to its weight's dtype, and so does the step.

# One layer each: what is checked is how the step reads the architecture, not its depth.
ATTENTION_FREE = {
    "mamba": {"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 1,
              "vocab_size": 256, "state_size": 8},
    "rwkv": {"model_type": "rwkv", "hidden_size": 64, "num_hidden_layers": 1,
             "vocab_size": 256, "attention_hidden_size": 64},
    "xlstm": {"model_type": "xlstm", "hidden_size": 64, "num_hidden_layers": 1,
              "vocab_size": 256, "num_heads": 4},
}  # fmt: skip


@pytest.mark.parametrize("fused", [False, True], ids=["logits", "--fused"])
@pytest.mark.parametrize("what", sorted(ATTENTION_FREE))
def test_an_attention_free_architecture_is_stepped(
    run_cli: Any, tmp_path: Path, what: str, fused: bool
) -> None:
    args = ("step", "--config", _config(tmp_path, ATTENTION_FREE[what]), "--tokens", "16")
    code, out, err = run_cli(*args, *(["--fused"] if fused else []))
    assert code == 0, err
    assert "attention: none: an attention-free architecture" in out, out
    assert "[B,h,S,S]" not in out, out


def test_an_attention_model_still_needs_its_heads(run_cli: Any, tmp_path: Path) -> None:
    config = {k: v for k, v in SMALL.items() if k != "num_attention_heads"}
    args = ("step", "--config", _config(tmp_path, {**config, "model_type": "llama"}))
    err = one_line(*run_cli(*args, "--tokens", "16"))
    assert "the llama config gives no num_attention_heads" in err, err


# -- a model whose table of learned positions is empty (gpt2's n_positions 0, opt's
# max_position_embeddings 0): step said "give --tokens 0 or fewer", a count no flag takes,
# and plan --step planned 0 tokens, then refused "--tokens ... got 0", a flag it has not.

NO_POSITIONS = {
    "gpt2, n_positions 0": {
        "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256,
        "n_positions": 0,
    },
    "opt, max_position_embeddings 0": {
        **SMALL, "model_type": "opt", "ffn_dim": 128, "max_position_embeddings": 0,
    },
}  # fmt: skip


@pytest.mark.parametrize("command", ["step", "plan --step"])
@pytest.mark.parametrize("what", sorted(NO_POSITIONS))
def test_a_model_of_no_positions_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    path = _config(tmp_path, NO_POSITIONS[what])
    args = {
        "step": ("step", "--config", path, "--tokens", "16"),
        "plan --step": ("plan", "--step", "--config", path, "--budget", "1GiB"),
    }[command]
    err = one_line(*run_cli(*args))
    assert "learned positions for no token" in err and "--tokens" not in err, err
