"""The configs under ``examples/`` (the README's ``plan --step`` block reads one) load as
the models they are named for."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from memprobe.profile.hf import load_config  # noqa: E402

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_the_llama1b_example_is_llama_3_2_1b_shaped() -> None:
    config = load_config(EXAMPLES / "llama1b")
    shape = (config.hidden_size, config.num_hidden_layers, config.vocab_size)
    assert (config.model_type, *shape) == ("llama", 2048, 16, 128_256)
    assert (config.num_attention_heads, config.num_key_value_heads) == (32, 8)
    assert config.tie_word_embeddings
