"""``plan --hidden`` never answers for a layout the hidden backend cannot simulate per rank.

The hidden family's simulation holds the whole sequence on one device; a plan at cp N
used to divide that by N and report it as one rank's tokens. The planner now asks the
hidden backend's layout rule (the one the sweep skips by) and refuses, one line.
"""

from __future__ import annotations

import pytest

from memprobe import plan
from memprobe.errors import UserError
from memprobe.kernels import kernel_names
from memprobe.measure import measure
from memprobe.measure.protocol import HIDDEN
from memprobe.records import Case

HIDDEN_KERNELS = kernel_names(inputs="hidden")


@pytest.mark.parametrize("kernel", HIDDEN_KERNELS)
@pytest.mark.parametrize("cp", [2, 4, 7])
def test_a_hidden_target_at_cp_above_one_is_refused(kernel, cp):
    with pytest.raises(UserError, match=rf"{kernel} at tp 1 cp {cp}: the hidden family runs"):
        plan.PlanTarget(kernel, vocab=4096, hidden=64, cp=cp)


@pytest.mark.parametrize(("tp", "cp"), [(1, 2), (1, 8), (2, 1), (4, 4)])
def test_plan_and_sweep_share_one_rule(tp, cp):
    """The sweep skips the case for the same reason the planner gives."""
    case = Case("linear_unchunked", 1, 64 * cp, 4096, "bf16", None, tp, cp, "meta", 64)
    run = measure(case)
    assert run.status == "skipped"
    assert run.note == HIDDEN.unsupported_layout(tp, cp)
    assert HIDDEN.unsupported_layout(1, 1) is None


@pytest.mark.parametrize(
    "args",
    [
        ["--cp", "4", "--kernel", "linear_unchunked"],
        ["--cp", "1,2", "--kernel", "fused_linear_chunked"],
        ["--cp", "2"],  # the default hidden kernels
        ["--cp", "16", "--kernel", "torch_linear_ce", "--json"],
    ],
)
def test_plan_cli_refuses_hidden_with_cp(run_cli, args):
    code, out, err = run_cli(
        "plan", "--vocab", "4096", "--budget", "64MiB", "--hidden", "64", "--no-reserved", *args
    )
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "the hidden family runs on one device" in err and "--cp 1" in err


def test_hidden_at_cp_one_still_plans(run_cli):
    code, out, err = run_cli(
        "plan", "--vocab", "4096", "--budget", "64MiB", "--hidden", "64", "--no-reserved",
        "--kernel", "linear_unchunked", "--cp", "1",
    )  # fmt: skip
    assert code == 0, err
    assert "linear_unchunked fits the most" in out.splitlines()[-1]


def test_hidden_with_tp_names_no_logits_kernel(run_cli) -> None:
    code, _, err = run_cli("plan", "--vocab", "4096", "--budget", "8GiB", "--hidden", "64",
                           "--tp", "2", "--no-reserved")  # fmt: skip
    assert code == 2
    assert "the hidden family runs on one device" in err
    assert "chunked_distributed" not in err
    assert len(err.strip().splitlines()) == 1
