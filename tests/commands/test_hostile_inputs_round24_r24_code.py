"""Hostile inputs, round 24 (user code memprobe imports and runs: a user's kernel, a
user's step, the module each lives in): each row is a variant of a defect class the pass
found. One line and exit 2, the case's error row, or a sane answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, user_module

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--device", "meta",
         "--no-verify", "--no-report", "--json"]  # fmt: skip
PLAN = ["plan", "--vocab", "128", "--budget", "1MiB", "--no-reserved"]

# A kernel module: ``{pre}`` at module level, then a kernel whose body is ``{body}``.
KERNEL = (
    "import sys, os, torch\nfrom memprobe.kernels import get_kernel\n"
    "_u = get_kernel('unchunked')\n{pre}\n"
    "def k(logits, targets, *, chunk_size=None):\n    {body}\n"
)
RETURNS = "return _u(logits, targets)"


def _kernel(here: Path, stem: str, pre: str = "", body: str = RETURNS) -> str:
    return user_module(here, stem, KERNEL.format(pre=pre, body=body)) + ":k"


def _rows(out: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(out)["results"]
    return rows


# -- memprobe's own exception classes, raised by user code: a kernel that raised
# memprobe.errors.UserError ended the whole sweep with its message as memprobe's own line
# ("memprobe: error: forged message"), the other kernels unmeasured, and plan said it
# without naming the kernel; one that raised memprobe.errors.Unwind (memprobe's unwinding of
# a rank whose peer failed) passed the guard as memprobe's and ended a sweep, a plan or a
# profile in a traceback with exit status 1. Each is the code's failure, as any other.

OWN_CLASSES = {
    "UserError": ("from memprobe.errors import UserError as E", "E('mine', 'a hint')"),
    "UserError without a hint": ("from memprobe.errors import UserError as E", "E('mine')"),
    "Unwind": ("from memprobe.errors import Unwind as E", "E('mine')"),
    "a PeerFailed of its own": (
        "from memprobe.measure.rank_agreement import PeerFailed as E",
        "E('error', 1, 'mine')",
    ),
    "a subclass of UserError": (
        "from memprobe.errors import UserError\nclass E(UserError): pass",
        "E('mine')",
    ),
}


@pytest.mark.parametrize("what", OWN_CLASSES)
def test_memprobes_own_exception_from_a_kernel_is_its_failure(
    run_cli: Any, here: Path, what: str
) -> None:
    pre, raised = OWN_CLASSES[what]
    kernel = _kernel(here, "r24_own", pre, f"raise {raised}")
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    rows = _rows(out)
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert kernel in rows[0]["note"] and "mine" in rows[0]["note"]
    line = one_line(*run_cli(*PLAN, "--kernel", kernel))
    assert f"{kernel} failed" in line and "mine" in line


@pytest.mark.parametrize("what", ["UserError", "Unwind"])
def test_memprobes_own_exception_from_a_step_or_hidden_kernel_is_one_line(
    run_cli: Any, here: Path, what: str
) -> None:
    pre, raised = OWN_CLASSES[what]
    step = user_module(here, "r24_ownstep", f"{pre}\ndef step(device):\n    raise {raised}\n")
    line = one_line(*run_cli("profile", f"{step}:step", "--out", "s.pickle"))
    assert f"the step raised {what}" in line and "mine" in line
    assert not (here / "s.pickle").exists()
    body = f"{pre}\ndef k(hidden, weight, targets, *, chunk_size=None):\n    raise {raised}\n"
    kernel = user_module(here, "r24_ownhidden", body) + ":k"
    flags = ["--hidden", "32", "--kernel", f"{kernel},fused_linear_chunked"]
    code, out, err = run_cli(*SWEEP, *flags)
    assert code == 0, err
    assert [r["status"] for r in _rows(out)] == ["error", "ok"]


def test_an_unwind_memprobe_issued_still_passes_the_guard() -> None:
    from memprobe.errors import Unwind
    from memprobe.kernels.user import user_code

    with pytest.raises(Unwind), user_code("mine:k"):
        raise Unwind("a peer failed").issued()


def test_memprobes_own_step_keeps_its_own_user_errors() -> None:
    from memprobe.errors import UserError
    from memprobe.kernels.user import user_code

    with pytest.raises(UserError, match="memprobe's"), user_code("the step", its_state=False):
        raise UserError("memprobe's")
