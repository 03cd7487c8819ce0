"""What `memprobe step` refuses because the step it would simulate is not the model's:

- a hidden-family kernel on a model that changes its logits after the lm_head (gemma2's
  softcap, granite's divisor, cohere's factor): the kernel computes the log-probs of
  hidden @ weight.T and skips the change, so its peak was printed for another model;
- a config whose ``architectures`` names only a head with no lm_head over the vocabulary
  (a reward model's sequence classifier): it was stepped as the causal LM of its sizes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line
from small_config import SMALL

GEMMA2 = {**SMALL, "model_type": "gemma2", "head_dim": 16, "sliding_window": 8}

# A model and the field its logits change by (None: its default holds the change).
TRANSFORMED = {
    "gemma2 (its default softcap)": (GEMMA2, "final_logit_softcapping=30"),
    "gemma2 softcap given": ({**GEMMA2, "final_logit_softcapping": 50.0}, "=50"),
    "granite": ({**SMALL, "model_type": "granite", "logits_scaling": 8.0}, "logits_scaling=8"),
    "cohere": ({**SMALL, "model_type": "cohere"}, "logit_scale=0.0625"),
}
# The same models where the field leaves the logits alone, and a model whose config.json
# carries such a key its modeling code never reads: stepped as before.
UNCHANGED = {
    "gemma2 softcap off": {**GEMMA2, "final_logit_softcapping": None},
    "granite at 1": {**SMALL, "model_type": "granite", "logits_scaling": 1.0},
    "llama with a stray key": {**SMALL, "model_type": "llama", "logit_scale": 0.5},
}


def _step(run_cli: Any, tmp_path: Path, config: dict[str, Any], *flags: str):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return run_cli("step", "--config", str(tmp_path), "--tokens", "16", *flags)


@pytest.mark.parametrize("model", TRANSFORMED)
def test_a_hidden_kernel_on_changed_logits_is_refused(run_cli, tmp_path: Path, model: str):
    config, field = TRANSFORMED[model]
    err = one_line(*_step(run_cli, tmp_path, config, "--kernel", "fused_linear_chunked"))
    assert "changes its logits after the lm_head" in err and field in err, err
    assert "--kernel local_chunked" in err
    # A logits kernel takes the model's own logits, changes and all.
    code, _, err = _step(run_cli, tmp_path, config, "--kernel", "local_chunked")
    assert code == 0, err


@pytest.mark.parametrize("model", UNCHANGED)
def test_logits_left_alone_take_a_hidden_kernel(run_cli, tmp_path: Path, model: str):
    code, _, err = _step(run_cli, tmp_path, UNCHANGED[model], "--kernel", "fused_linear_chunked")
    assert code == 0, err


@pytest.mark.parametrize(
    ("architectures", "refused"),
    [
        (["LlamaForSequenceClassification"], True),
        (["LlamaForTokenClassification", "LlamaModel"], True),
        (["LlamaForCausalLM"], False),
        (["LlamaForSequenceClassification", "LlamaForCausalLM"], False),
        ([], False),
    ],
)
def test_a_config_of_another_head_is_refused(
    run_cli, tmp_path: Path, architectures: list[str], refused: bool
):
    config = {**SMALL, "model_type": "llama", "architectures": architectures}
    code, out, err = _step(run_cli, tmp_path, config)
    if refused:
        line = one_line(code, out, err)
        assert f"names '{architectures[0]}'" in line and "drop architectures" in line, line
    else:
        assert code == 0, err
