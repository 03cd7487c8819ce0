"""Hostile inputs, round 7: user kernels that return something other than one log-prob
per target (the whole log-softmax, integers, a tuple, a NumPy array, a float). A sweep
records the case as an error that says what came back, a plan or a what-if is one line
and exit 2; none measures it as if it were a kernel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from small_config import SMALL

LP = "logits.float().log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)"
# What the kernel returns, and what the one line says of it.
RETURNS = {
    "the whole log-softmax": ("logits.float().log_softmax(-1)", "tensor of shape [1, 64, 256]"),
    "the targets (int64)": ("targets", "int64 tensor of shape [1, 64]"),
    "a bool mask": ("targets > 0", "bool tensor of shape [1, 64]"),
    "one number per row": (f"{LP}.sum(-1)", "float32 tensor of shape [1]"),
    "a tuple": (f"({LP}, {LP})", "returned tuple, not a tensor of shape [1, 64]"),
    "a NumPy array": ("__import__('numpy').zeros((1, 64))", "returned ndarray, not a tensor"),
    "a float": ("0.0", "returned float, not a tensor of shape [1, 64]"),
    "None": ("None", "returned NoneType, not a tensor"),
}
FLAGS = ["--tokens", "64", "--vocab", "256", "--no-ladder", "-q", "--device", "meta"]


def _kernel(here: Path, returns: str) -> str:
    name = f"r7_kernel_{abs(hash(returns)) % 10**8}"
    body = f"def k(logits, targets, *, chunk_size=None):\n    return {returns}\n"
    (here / f"{name}.py").write_text(body)
    return f"{name}:k"


@pytest.mark.parametrize("what", sorted(RETURNS))
def test_a_kernel_returning_the_wrong_thing_is_said_so(run_cli, here: Path, what: str) -> None:
    returns, says = RETURNS[what]
    kernel = _kernel(here, returns)
    code, _, err = run_cli(
        "sweep", "--no-report", *FLAGS, "--no-verify", "--kernel", kernel, "--out", "o"
    )
    assert code == 0, err
    (row,) = json.loads((here / "o" / "results.json").read_text())["rows"]
    assert row["status"] == "error" and says in row["note"], row["note"]
    assert row["peak_bytes"] is None
    code, out, err = run_cli("plan", "--vocab", "256", "--budget", "1GiB", "--kernel", kernel)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert f"{kernel} failed in the meta simulation" in err


def test_a_what_if_with_a_kernel_of_the_wrong_shape_predicts_nothing(run_cli, here: Path) -> None:
    # The what-if's stand-in loss took the kernel's output shape for the gradient's, so
    # the whole log-softmax was spliced in and predicted, where a sweep and a plan fail.
    (here / "r7_step.py").write_text(
        "import torch\nimport torch.nn.functional as F\n"
        "def step(device):\n"
        "    w = torch.randn(256, 32, device=device, requires_grad=True)\n"
        "    h = torch.randn(1, 64, 32, device=device)\n"
        "    ids = torch.randint(0, 256, (1, 64), device=device)\n"
        "    logits = h @ w.t()\n"
        "    F.cross_entropy(logits.float().view(-1, 256), ids.view(-1)).backward()\n"
    )
    code, _, err = run_cli("profile", "r7_step:step", "--out", "s.pickle", "--top", "1")
    assert code == 0, err
    good = run_cli("attribute", "s.pickle", "--top", "1", "--what-if", "local_chunked")
    assert good[0] == 0, good[2]
    kernel = _kernel(here, RETURNS["the whole log-softmax"][0])
    code, out, err = run_cli("attribute", "s.pickle", "--top", "1", "--what-if", kernel)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "a kernel returns one floating log-prob per target" in err


# Kernels whose values are not finite where float64's are: NaN and inf were stored as "no
# value", so the row read as a kernel never checked (status ok, blank errors).
NOT_FINITE = {
    "NaN output": (f"{LP} * float('nan')", "forward nan"),
    "-inf output": (f"{LP} - float('inf')", "forward inf"),
    "NaN gradient only": (f"{LP} + ({LP} - {LP}.detach()).abs() ** 0.5", "backward nan"),
}


@pytest.mark.parametrize("what", sorted(NOT_FINITE))
def test_a_kernel_with_values_that_are_not_finite_fails_its_check(
    run_cli, here: Path, what: str
) -> None:
    returns, says = NOT_FINITE[what]
    kernel = _kernel(here, returns)
    flags = ["--tokens", "16", "--vocab", "32", "--no-ladder", "-q", "--device", "cpu"]
    code, _, err = run_cli(
        "sweep", "--no-report", *flags, "--kernel", f"{kernel},unchunked", "--out", "o"
    )
    assert code == 0, err
    mine, reference = json.loads((here / "o" / "results.json").read_text())["rows"]
    assert mine["status"] == "error" and "numerics check failed" in mine["note"], mine
    assert says in mine["note"] and mine["peak_bytes"] > 0
    assert reference["status"] == "ok" and reference["max_abs_err_fwd"] is not None


# Flags only the whole-step plan reads: a logprob plan (no --step) ran on without them,
# as --fsdp and --mp-* are already refused.
@pytest.mark.parametrize(
    "flags", [["--checkpointing"], ["--optimizer", "sgd"], ["--optimizer", "none"]]
)
def test_whole_step_flags_without_step_are_refused(run_cli, here: Path, flags) -> None:
    args = ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "local_chunked", *flags]
    code, out, err = run_cli(*args)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "plan the whole training step" in err and "--step --config" in err


# A team's rendezvous under --shard waits twice --case-timeout as a timedelta: inf or 1e300
# passed `min=` and overflowed there: a traceback on each rank of a tp/cp team.
@pytest.mark.parametrize("value", ["inf", "1e300", "1e400", "1000001"])
def test_a_case_timeout_past_its_bound_is_refused(run_cli, here: Path, value: str) -> None:
    code, out, err = run_cli("sweep", *FLAGS, "--shard", "--case-timeout", value, "--out", "o")
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "--case-timeout" in err and not (here / "o").exists()


# A bad --mp-param was reported as "--dtype 'fp8' is not one of ...": a flag not given.
@pytest.mark.parametrize("command", ["plan", "step"])
@pytest.mark.parametrize("value", ["fp8", "int8", "BF17"])
def test_a_bad_mp_param_names_mp_param(run_cli, here: Path, command: str, value: str) -> None:
    (here / "cfg").mkdir()
    (here / "cfg" / "config.json").write_text(json.dumps(SMALL))
    size = ["--budget", "64MiB", "--step"] if command == "plan" else ["--tokens", "64"]
    args = [command, "--config", "cfg", *size, "--fsdp", "2", "--mp-param", value]
    code, out, err = run_cli(*args)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert f"--mp-param {value!r} is not one of" in err and "--dtype" not in err


# A run with no measured times (meta, or every row failed) gave --from-run nothing to
# read: the plan ran on as without it, and told the user to add --from-run DIR.
@pytest.mark.parametrize("rows", ["as swept on meta", "every row an error", "no rows"])
def test_from_run_without_times_is_refused(run_cli, made_run: Path, here: Path, rows) -> None:
    import shutil

    run = here / "run"
    shutil.copytree(made_run, run)
    data = json.loads((run / "results.json").read_text())
    if rows == "every row an error":
        for row in data["rows"]:
            row.update(status="error", note="RuntimeError: x", fwd_time_s=None, bwd_time_s=None)
    elif rows == "no rows":
        data["rows"] = []
    (run / "results.json").write_text(json.dumps(data))
    args = ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "local_chunked"]
    code, out, err = run_cli(*args, "--from-run", str(run))
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "has no measured times" in err and "drop --from-run" in err


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2,2,1", [2, 1]), ("1024, 1024,2048,1_024", [1024, 2048]), ("none,4,none", [None, 4])],
)
def test_a_value_given_twice_is_one_value(text: str, expected: list[int | None]) -> None:
    from memprobe.commands.flags import int_list, name_list

    assert int_list(text, "--tp", allow_none=True) == expected
    assert name_list("local_chunked, unchunked,local_chunked", "--kernel") == [
        "local_chunked",
        "unchunked",
    ]


def test_plan_names_a_repeated_tp_once(run_cli: Any) -> None:
    """plan --tp 2,2,1 said 'not planned: local_chunked at tp 2, local_chunked at tp 2'."""
    code, out, err = run_cli(
        "plan", "--vocab", "4096", "--budget", "1GiB", "--kernel", "local_chunked",
        "--tp", "2,2,1", "--no-reserved",
    )  # fmt: skip
    assert code == 0, err
    assert out.count("local_chunked at tp 2") == 1


@pytest.mark.parametrize("step", [[], ["--step"]], ids=["config alone", "with --step"])
def test_a_whole_step_plans_refusal_names_the_flags_given(
    run_cli: Any, tmp_path: Path, step: list[str]
) -> None:
    """plan --config C --vocab V (no --step) said '--vocab does not apply to --step'."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL))
    args = ["plan", "--vocab", "256", "--budget", "1GiB", "--config", str(config), *step]
    code, _, err = run_cli(*args)
    assert code == 2 and "Traceback" not in err
    assert ("does not apply to --step:" in err) == bool(step)
    # --config alone is refused for the --step it lacks (round 21), before --vocab.
    assert ("which --step asks for (add --step, or drop --config)" in err) == (not step)
