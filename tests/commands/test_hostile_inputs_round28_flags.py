"""Hostile inputs, round 28 (the command line and the environment of every command: flag
values, flags that each make sense but contradict one another, and the variables memprobe
or torch read): each row is a variant of a defect class the pass found. One line and exit
2, or a sane answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line
from small_config import SMALL

from memprobe.plan.model import PlanTarget, Probe
from memprobe.render.plan_text import probe_line

PLAN = ["plan", "--vocab", "128", "--budget", "1MiB", "--no-reserved"]


def _config(tmp_path: Path) -> str:
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    return str(tmp_path / "config.json")


# -- a vocabulary-sharding kernel (distributed, chunked_distributed) in a step with no --tp
# but with --cp or --fsdp (`step --cp 2 --kernel distributed`): the refusal said "memprobe
# step runs one GPU" while the step asked for was rank 0 of two. It now names what is
# missing, the tensor-parallel ranks.
NO_TP = {
    "step --cp 2": ["step", "--tokens", "16", "--cp", "2"],
    "step --fsdp 2": ["step", "--tokens", "16", "--fsdp", "2"],
    "step alone": ["step", "--tokens", "16"],
    "plan --step --fsdp 2": ["plan", "--step", "--budget", "1GiB", "--fsdp", "2"],
}


@pytest.mark.parametrize("kernel", ["distributed", "chunked_distributed"])
@pytest.mark.parametrize("args", NO_TP.values(), ids=list(NO_TP))
def test_a_vocabulary_sharding_kernel_without_tp_names_tp(
    run_cli: Any, tmp_path: Path, args: list[str], kernel: str
) -> None:
    err = one_line(*run_cli(*args, "--config", _config(tmp_path), "--kernel", kernel))
    assert "tensor-parallel" in err and "--tp N" in err and "one GPU" not in err, err


# -- `plan --batch 2`: the table's column said tokens/seq and the answer "291 tokens per
# sequence x 2 sequences = 582 per GPU", but the progress line on stderr said "291
# tokens/GPU", half what the GPU holds; the live bar's probes alike. Both now take the
# table's unit.
BATCHES = {
    "batch 2": (["--batch", "2"], "tokens/seq"),
    "batch 3 with cp 2": (["--batch", "3", "--cp", "2"], "tokens/seq"),
    "batch 1": (["--batch", "1"], "tokens/GPU"),
    "no --batch": ([], "tokens/GPU"),
}


@pytest.mark.parametrize(("args", "unit"), BATCHES.values(), ids=list(BATCHES))
def test_the_progress_line_counts_what_the_table_counts(
    run_cli: Any, args: list[str], unit: str
) -> None:
    code, out, err = run_cli(*PLAN, "--kernel", "unchunked", *args)
    assert code == 0 and f"  {unit}  " in out, out
    assert err.startswith("[1/1] unchunked") and err.rstrip().endswith(f" {unit}"), err


@pytest.mark.parametrize(
    ("batch", "unit"), [(1, "tokens/GPU"), (2, "tokens/seq"), (64, "tokens/seq")]
)
def test_a_probe_line_counts_what_the_table_counts(batch: int, unit: str) -> None:
    probe = Probe(PlanTarget("unchunked", 128, batch=batch), "allocated", 100, 10, 20)
    assert f": 100 {unit} -> " in probe_line(probe)
    assert ": 100 tokens/sequence -> " in probe_line(probe, "tokens/sequence")


# -- `plan --step --fsdp 2 --batch 2` (a sharded step of several sequences): the header said
# "tokens per GPU" and the progress line "445 tokens/GPU", while the table's column said
# tokens/seq and the answer "445 tokens per sequence x 2 sequences = 890 per GPU". A
# sharded step's count is per GPU only at --batch 1. (The search itself is stubbed: a
# whole step's search takes seconds.)
STEP_UNITS = {
    "sharded, batch 2": ({"world": 2}, 2, "tokens/sequence"),
    "sharded, batch 8": ({"world": 4}, 8, "tokens/sequence"),
    "sharded, batch 1": ({"world": 2}, 1, "tokens/GPU"),
    "one GPU, batch 2": (None, 2, "tokens/sequence"),
    "one GPU, batch 1": (None, 1, "tokens/sequence"),
}


@pytest.mark.parametrize(("layout", "batch", "unit"), STEP_UNITS.values(), ids=list(STEP_UNITS))
def test_a_whole_steps_progress_counts_per_gpu_only_at_batch_one(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, layout: Any, batch: int, unit: str
) -> None:
    from types import SimpleNamespace

    from memprobe.commands import step
    from memprobe.plan import whole_step

    def plan_step(base: Any, kernels: list[str], limit: Any, *, on_done: Any, **_: Any) -> list:
        on_done(SimpleNamespace(target=SimpleNamespace(kernel="unchunked"), max_tokens=445))
        return []

    monkeypatch.setattr(whole_step, "plan_step", plan_step)
    base = SimpleNamespace(sharded_summary=lambda: layout, batch=batch)
    step._plan_with_progress(base, ["unchunked"], None)  # type: ignore[arg-type]
    assert capsys.readouterr().err.strip() == f"[1/1] unchunked: 445 {unit}"


# ... and the page `plan --batch 2 --out DIR` writes: the plot's x axis and its caption said
# "tokens per GPU" of the per-sequence counts it drew.
@pytest.mark.parametrize(
    ("batch", "counted"), [("2", "tokens per sequence"), ("1", "tokens per GPU")]
)
def test_the_plan_pages_plot_counts_what_the_table_counts(
    run_cli: Any, tmp_path: Path, batch: str, counted: str
) -> None:
    code, _, err = run_cli(*PLAN, "--kernel", "unchunked", "--batch", batch, "--out", str(tmp_path))
    assert code == 0, err
    page = (tmp_path / "plan.html").read_text()
    assert f"simulated peak against {counted}" in page


# -- a hint that is a command to type, naming a run directory whose name is not one shell
# word (`sweep --out 'my run'` a second time): "continue it with --resume my run" ran
# as --resume my, and "--resume it's" opened a quote the shell waited to close. The
# path is now quoted as the shell takes it (the gate's own hint, and report's, alike).
ODD_NAMES = ["my run", "it's", "a;b", "$HOME", "-dash"]


@pytest.fixture
def sweep_args() -> list[str]:
    return ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
            "--device", "meta", "--no-verify", "--no-report", "-q"]  # fmt: skip


@pytest.mark.parametrize("name", ODD_NAMES)
def test_a_resume_hint_is_one_shell_word(
    run_cli: Any, here: Path, sweep_args: list[str], name: str
) -> None:
    import shlex

    assert run_cli(*sweep_args, "--out", name)[0] == 0
    err = one_line(*run_cli(*sweep_args, "--out", name))
    hint = err.rstrip().split("continue it with ", 1)[1].removesuffix(")")
    assert shlex.split(hint) == ["--resume", name], err


def test_the_gates_hint_quotes_its_run(run_cli: Any, here: Path, sweep_args: list[str]) -> None:
    assert run_cli(*sweep_args, "--out", "my run")[0] == 0
    (here / "pyproject.toml").write_text(
        "[tool.memprobe.sweep]\ntokens = [64]\nvocab = [128]\nkernel = ['unchunked']\n"
        "device = 'meta'\n[tool.memprobe.gate]\n"
        "rules = [{ kernel = 'unchunked', max_peak = '1 GiB' }]\n"
    )
    err = one_line(*run_cli("gate", "--out", "my run"))
    assert "`memprobe gate 'my run'`" in err and "`memprobe sweep --resume 'my run'`" in err, err


@pytest.mark.parametrize("name", ["base line.json", "it's.json"])
def test_the_gates_baseline_hint_quotes_its_file(
    run_cli: Any, here: Path, sweep_args: list[str], name: str
) -> None:
    import shlex

    assert run_cli(*sweep_args, "--out", "run")[0] == 0
    (here / "pyproject.toml").write_text(f'[tool.memprobe.gate]\nbaseline = "{name}"\n')
    err = one_line(*run_cli("gate", "run"))
    command = err.split("`")[1]
    assert shlex.split(command)[-2:] == ["--update-baseline", str(here / name)], err


def test_the_pages_re_render_line_quotes_its_run(
    run_cli: Any, here: Path, sweep_args: list[str]
) -> None:
    assert run_cli(*sweep_args, "--out", "my run")[0] == 0
    assert run_cli("report", "my run")[0] == 0
    assert "memprobe report &#39;my run&#39;" in (here / "my run" / "report.html").read_text()


# -- `sweep --hidden 64 --tp 2`: the refusal's hint was "use --tp with: distributed,
# chunked_distributed", kernels that take logits, which --hidden then refused in turn
# ("distributed takes logits, not hidden states"). As plan says: the hidden family runs
# on one device, so drop --tp, or --hidden.
HIDDEN_TP = {
    "all hidden kernels": ["--hidden", "64", "--tp", "2"],
    "a tp list": ["--hidden", "64", "--tp", "1,2"],
    "one named kernel": ["--hidden", "64", "--tp", "4", "--kernel", "fused_linear_chunked"],
}


@pytest.mark.parametrize("args", HIDDEN_TP.values(), ids=list(HIDDEN_TP))
def test_a_hidden_sweep_with_tp_is_told_to_drop_one(
    run_cli: Any, here: Path, sweep_args: list[str], args: list[str]
) -> None:
    base = [a for a in sweep_args if a not in ("--kernel", "unchunked")]
    err = one_line(*run_cli(*base, *args))
    assert "drop --tp, or drop --hidden" in err and "use --tp with" not in err, err
    assert not list(here.iterdir())


# ... while a logits sweep with --tp still names the kernels that shard the vocabulary.
def test_a_logits_sweep_with_tp_still_names_the_sharding_kernels(
    run_cli: Any, here: Path, sweep_args: list[str]
) -> None:
    err = one_line(*run_cli(*sweep_args, "--tp", "2"))
    assert "use --tp with: distributed, chunked_distributed" in err, err


# -- `plan --step --other 1MiB` (or --out, --from-run): refused with "the config gives the
# model", a reason of --vocab and --hidden; the whole step is all the GPU holds, its page
# is not written yet, a run's times pick the logprob plan's chunk size. Each says its own.
NOT_FOR_STEP = {
    "--other": (["--other", "1MiB"], "all the GPU holds"),
    "--other-from": (["--other-from", "s.pickle"], "all the GPU holds"),
    "--out": (["--out", "o"], "not written for a whole-step plan"),
    "--from-run": (["--from-run", "run"], "logprob plan's chunk size"),
    "--vocab": (["--vocab", "100"], "the config gives the model"),
    "--hidden": (["--hidden", "64"], "the config gives the model"),
}


@pytest.mark.parametrize(("args", "why"), NOT_FOR_STEP.values(), ids=list(NOT_FOR_STEP))
def test_a_flag_the_step_plan_refuses_says_why(
    run_cli: Any, tmp_path: Path, args: list[str], why: str
) -> None:
    config = _config(tmp_path)
    err = one_line(*run_cli("plan", "--step", "--config", config, "--budget", "1GiB", *args))
    assert f"{args[0]} does not apply to --step: " in err and why in err, err
