"""Hostile config.json files for ``memprobe step`` / ``plan --step``: one line, exit 2,
before any model is built. transformers would fill a missing size from its defaults,
raise its own validation errors, or build a billion layers; none of that reaches the user.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from small_config import SMALL

pytest.importorskip("transformers")

OK_TEXT = json.dumps(SMALL)


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in SMALL.items() if k != key}


# (what, config.json text, words the one line must hold)
CONFIGS = [
    ("no hidden size", json.dumps(_without("hidden_size")), "gives no hidden_size"),
    ("no layer count", json.dumps(_without("num_hidden_layers")), "gives no num_hidden_layers"),
    ("no vocabulary", json.dumps(_without("vocab_size")), "gives no vocab_size"),
    (
        "GPT-2 without n_embd (its own name)",
        json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 4, "vocab_size": 512}),
        "gives no n_embd",
    ),
    ("a size as text", json.dumps({**SMALL, "hidden_size": "64"}), "hidden_size is '64'"),
    ("a size with a fraction", json.dumps({**SMALL, "hidden_size": 64.5}), "hidden_size is 64.5"),
    ("a size as a boolean", json.dumps({**SMALL, "vocab_size": True}), "vocab_size is True"),
    ("zero layers", json.dumps({**SMALL, "num_hidden_layers": 0}), "from 1 to 1,024"),
    ("negative layers", json.dumps({**SMALL, "num_hidden_layers": -1}), "from 1 to 1,024"),
    ("a billion layers", json.dumps({**SMALL, "num_hidden_layers": 10**9}), "from 1 to 1,024"),
    ("zero heads", json.dumps({**SMALL, "num_attention_heads": 0}), "num_attention_heads is 0"),
    ("kv heads as text", json.dumps({**SMALL, "num_key_value_heads": "2"}), "num_key_value_heads"),
    (
        "an intermediate size past 2^40",
        json.dumps({**SMALL, "intermediate_size": 2**50}),
        "intermediate_size is 1125899906842624",
    ),
    ("400 digits", OK_TEXT[:-1] + ', "x": ' + "9" * 400 + "}", "integer of 400 digits"),
    (
        "ten 4,000-digit numbers",
        '{"model_type": "llama", "x": [' + ",".join(["9" * 4000] * 10) + "]}",
        "4,000 digits",
    ),
    ("NaN", OK_TEXT[:-1] + ', "rms_norm_eps": NaN}', "holds NaN"),
    ("-Infinity", OK_TEXT[:-1] + ', "rms_norm_eps": -Infinity}', "holds -Infinity"),
    ("100,000 nested lists", "[" * 100_000 + "]" * 100_000, "nests too deep"),
    ("50,000 nested objects", '{"a":' * 50_000 + "1" + "}" * 50_000, "nests too deep"),
    (
        "heads that do not divide the width (transformers' own validator)",
        json.dumps({**SMALL, "num_attention_heads": 5}),
        "config does not load",
    ),
    (
        "rope_scaling as text (transformers' own validator)",
        json.dumps({**SMALL, "rope_scaling": "yes"}),
        "config does not load",
    ),
    (
        "tie_word_embeddings as text",
        json.dumps({**SMALL, "tie_word_embeddings": "no"}),
        "config does not load",
    ),
]


@pytest.mark.parametrize(("what", "text", "words"), CONFIGS, ids=[c[0] for c in CONFIGS])
def test_a_bad_config_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, text: str, words: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    code, out, err = run_cli("step", "--config", str(path), "--tokens", "64")
    assert code == 2, (what, out, err)
    assert words in err, (what, err)
    assert err.count("\n") == 1 and "Traceback" not in err and len(err) < 400


@pytest.mark.parametrize("index", [0, 9, 18])
def test_plan_step_reads_configs_the_same_way(run_cli: Any, tmp_path: Path, index: int) -> None:
    what, text, words = CONFIGS[index]
    path = tmp_path / "config.json"
    path.write_text(text)
    code, _, err = run_cli("plan", "--step", "--config", str(path), "--budget", "80GiB")
    assert code == 2 and words in err and err.count("\n") == 1, (what, err)


def test_a_config_over_the_size_cap_is_refused_unread(run_cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    with path.open("w") as fh:  # a sparse file: 17 MiB that costs no disk
        fh.write(OK_TEXT)
        fh.truncate(17 << 20)
    code, _, err = run_cli("step", "--config", str(path), "--tokens", "64")
    assert code == 2 and "over the 16.00 MiB limit" in err and err.count("\n") == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_named_config_is_refused_without_waiting(run_cli: Any, tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    for target in (fifo, tmp_path):  # the FIFO itself, and the folder holding it
        code, _, err = run_cli("step", "--config", str(target), "--tokens", "64")
        assert code == 2 and "FIFO" in err and err.count("\n") == 1


STEP_SOURCE = """
import torch


def step(device):
    w = torch.zeros(8, 8, device=device, requires_grad=True)
    (w @ w).sum().backward()
"""


@pytest.mark.parametrize(
    "outputs",
    [
        ["--out", "{source}"],
        ["--html", "{source}", "--top", "1"],
        ["--out", "{here}/same", "--html", "{here}/same"],
    ],
)
def test_profile_outputs_never_replace_the_step_or_each_other(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outputs: list[str]
) -> None:
    # A module name of its own per case: an imported module stays in sys.modules.
    name = f"hostile_step_{len(outputs)}_{outputs[1].count('source')}"
    source = tmp_path / f"{name}.py"
    source.write_text(STEP_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, name, raising=False)
    args = [a.format(source=source, here=tmp_path) for a in outputs]
    code, _, err = run_cli("profile", f"{name}:step", *args)
    assert code == 2 and err.count("\n") == 1, err
    assert source.read_text() == STEP_SOURCE and not (tmp_path / "same").exists()


def test_step_out_never_replaces_its_config(run_cli: Any, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(OK_TEXT)
    for config in (tmp_path / "config.json", tmp_path):  # the file, or its folder
        code, _, err = run_cli(
            "step", "--config", str(config), "--tokens", "8", "--out", str(tmp_path / "config.json")
        )
        assert code == 2 and "would overwrite" in err and err.count("\n") == 1
        assert (tmp_path / "config.json").read_text() == OK_TEXT


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--vocab", "1000"], "--vocab"),
        (["--hidden", "64"], "--hidden"),
        (["--other-includes-lm-head"], "--other-includes-lm-head"),
        (["--other", "10GiB"], "--other"),
        (["--other-from", "a.pickle"], "--other-from"),
        (["--out", "plan-dir"], "--out"),
        (["--from-run", "run-dir"], "--from-run"),
    ],
)
def test_plan_step_refuses_flags_it_would_ignore(
    run_cli: Any, tmp_path: Path, flags: list[str], named: str
) -> None:
    (tmp_path / "config.json").write_text(OK_TEXT)
    code, _, err = run_cli("plan", "--step", "--config", str(tmp_path), "--budget", "1GiB", *flags)
    assert code == 2 and f"{named} does not apply to --step" in err and err.count("\n") == 1


@pytest.mark.parametrize("command", ["step", "plan"])
@pytest.mark.parametrize(
    "layout",
    [
        ["--fsdp", "16385"],
        ["--fsdp", "128", "--cp", "129"],
        ["--cp", str(2**20)],
        ["--fsdp", str(2**40), "--tp", "2"],
    ],  # fmt: skip
)
def test_a_shard_group_past_the_simulated_bound_is_refused_at_once(
    run_cli: Any, tmp_path: Path, command: str, layout: list[str]
) -> None:
    # torch's FSDP2 builds every rank's share of each all-gather: --fsdp 2^20 ran for hours.
    from memprobe.profile.sharded import MAX_SHARD_RANKS

    (tmp_path / "config.json").write_text(OK_TEXT)
    size = ["--tokens", "8"] if command == "step" else ["--step", "--budget", "1GiB"]
    code, _, err = run_cli(command, "--config", str(tmp_path), *size, *layout)
    assert code == 2 and err.count("\n") == 1, err
    assert f"at most {MAX_SHARD_RANKS:,} are simulated" in err


@pytest.mark.parametrize(
    "layout",
    [
        ["--tp", "2"],
        ["--fsdp", "2", "--kernel", "filtered_chunked"],
        ["--fsdp", "2", "--cp", "2", "--kernel", "local_tiled"],
    ],
)
def test_the_sharded_step_runs_few_chunks_and_keeps_every_peak(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: list[str]
) -> None:
    # The sharded step's tensors are fake (no values), so its kernels run only the chunks
    # that shape the peak, as on meta: --chunk-size 1 at 4,096 tokens took 80 s. The
    # shortened loop must answer exactly what every chunk does.
    from memprobe.kernels import _steps

    (tmp_path / "config.json").write_text(OK_TEXT)
    args = ("step", "--config", str(tmp_path), "--tokens", "48", "--chunk-size", "8", "--json")

    def phase_peaks() -> dict[str, int]:
        code, out, err = run_cli(*args, *layout)
        assert code == 0, err
        record = json.loads(out)
        return {"peak": record["peak_allocated_bytes"], **record["phase_peaks"]}

    shortened = phase_peaks()
    monkeypatch.setattr(_steps, "carries_values", lambda tensor: True)  # every chunk
    assert phase_peaks() == shortened
