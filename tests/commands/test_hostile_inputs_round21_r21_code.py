"""Hostile inputs, round 21 (user code memprobe imports and runs: a user's kernel, a
user's step, the pytest marker): each row is a variant of a defect class the pass found.
One line and exit 2, the case's error row, or a sane answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, user_module
from launch import forked_pytest
from small_config import SMALL

pytest_plugins = ["pytester"]

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--device", "meta",
         "--no-verify", "--no-report", "--json"]  # fmt: skip
PLAN = ["plan", "--vocab", "128", "--budget", "1MiB", "--no-reserved"]

LOGITS = (
    "import sys, torch\nfrom memprobe.kernels import get_kernel\n_u = get_kernel('unchunked')\n"
)
# A kernel whose forward is memprobe's unchunked one and whose backward is {backward}
# (a custom autograd Function's, indented for its body).
OWN_BACKWARD = LOGITS + (
    "class _F(torch.autograd.Function):\n"
    "    @staticmethod\n"
    "    def forward(ctx, logits, targets):\n"
    "        ctx.save_for_backward(logits)\n"
    "        return _u(logits.detach(), targets).detach()\n"
    "    @staticmethod\n"
    "    def backward(ctx, grad):\n"
    "{backward}"
    "def k(logits, targets, *, chunk_size=None):\n"
    "    return _F.apply(logits, targets)\n"
)

# -- a BaseException that is not an Exception raised in a kernel's backward (its custom
# autograd Function's, a hook it put on its input): the forward's guards turn a sys.exit()
# there into the case's error, but backward ran bare. A sweep, a plan and a --what-if ended
# with the kernel's own exit status and nothing printed (a GeneratorExit: a traceback), and
# `memprobe step` said "the step called sys.exit(3) ... remove the exit", of its own step.

BACKWARD_EXITS = {
    "sys.exit(3)": ("        sys.exit(3)\n", "backward called sys.exit(3)"),
    "sys.exit('message')": ("        sys.exit('stop here')\n", "backward called sys.exit("),
    "GeneratorExit": ("        raise GeneratorExit\n", "backward raised GeneratorExit"),
    "a BaseException of its own": (
        "        raise type('Halt', (BaseException,), {})('x')\n",
        "backward raised Halt",
    ),
}
HOOKED = LOGITS + (
    "def k(logits, targets, *, chunk_size=None):\n"
    "    def hook(grad):\n"
    "        raise SystemExit(4)\n"
    "    logits.register_hook(hook)\n"
    "    return _u(logits, targets)\n"
)


# A step whose loss --what-if finds: log_softmax of an lm_head's logits, and their gradient.
LOSS_STEP = (
    "import torch\n"
    "def step(device):\n"
    "    w = torch.zeros(512, 64, device=device, dtype=torch.bfloat16, requires_grad=True)\n"
    "    h = torch.zeros(1, 128, 64, device=device, dtype=torch.bfloat16, requires_grad=True)\n"
    "    t = torch.zeros(1, 128, 1, dtype=torch.long, device=device)\n"
    "    lp = torch.log_softmax((h @ w.T).float(), -1).gather(-1, t)\n"
    "    (-lp.mean()).backward()\n"
)


def _backward_exit_kernel(here: Path, what: str) -> tuple[str, str]:
    if what == "a hook on the logits":
        return user_module(here, "r21_hook", HOOKED) + ":k", "backward called sys.exit(4)"
    body, said = BACKWARD_EXITS[what]
    return user_module(here, "r21_bwd", OWN_BACKWARD.format(backward=body)) + ":k", said


@pytest.mark.parametrize("what", [*BACKWARD_EXITS, "a hook on the logits"])
def test_an_exit_in_a_kernels_backward_is_the_kernels_failure(
    run_cli: Any, here: Path, what: str
) -> None:
    kernel, said = _backward_exit_kernel(here, what)
    code, out, _ = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert said in rows[0]["note"] and kernel in rows[0]["note"]
    line = one_line(*run_cli(*PLAN, "--kernel", kernel))
    assert said in line and kernel in line


# ...and the backward runs in memprobe's torch state, as before that guard: with the state
# its module set as it was imported swapped in, a module that turned on anomaly detection
# failed every backward on meta in anomaly mode's NaN check (.item() of a meta tensor).
ANOMALY = {
    "set_detect_anomaly": "torch.autograd.set_detect_anomaly(True)\n",
    "detect_anomaly entered": "torch.autograd.detect_anomaly().__enter__()\n",
}


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")  # torch's, as asked
@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("what", ANOMALY)
def test_a_kernels_module_in_anomaly_mode_is_measured(
    run_cli: Any, here: Path, what: str, device: str
) -> None:
    body = LOGITS + ANOMALY[what] + "def k(logits, targets, *, chunk_size=None):\n"
    kernel = user_module(here, "r21_anomaly", body + "    return _u(logits, targets)\n") + ":k"
    flags = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--no-report"]
    code, out, err = run_cli(
        *flags, "--json", "--device", device, "--kernel", f"{kernel},unchunked"
    )
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["ok", "ok"], rows[0]["note"]
    assert rows[0]["peak_bytes"] == rows[1]["peak_bytes"]


@pytest.mark.parametrize("what", ["sys.exit(3)", "GeneratorExit", "a hook on the logits"])
def test_an_exit_in_a_kernels_backward_in_a_what_if_and_a_step(
    run_cli: Any, here: Path, what: str
) -> None:
    kernel, said = _backward_exit_kernel(here, what)
    (here / "config.json").write_text(json.dumps(SMALL))
    step = ["step", "--config", "config.json", "--tokens", "8", "--kernel", kernel]
    line = one_line(*run_cli(*step))
    assert said in line and kernel in line and "the step" not in line
    step = user_module(here, "r21_loss", LOSS_STEP) + ":step"
    assert run_cli("profile", step, "--out", "s.pickle")[0] == 0
    line = one_line(*run_cli("attribute", "s.pickle", "--what-if", kernel))
    assert said in line and kernel in line


# -- `memprobe step` blamed the model, or "the step", for what the user's kernel did
# outside its forward's return value checks: an exception its backward raised ("the model
# built from config.json cannot run this op: check the config's sizes"), a sys.exit() in
# its forward ("the step called sys.exit(5) ... remove the exit", of memprobe's own step),
# and a result whose __torch_function__ refuses every call ("check the config's sizes"
# again). A subclass whose plain .shape raised was one too; since round 27 a result of a
# user's subclass is read as torch's own tensor (test_hostile_inputs_round27_code).

STEP_BLAME = {
    "its backward raises": (
        OWN_BACKWARD.format(backward="        raise ValueError('bad backward')\n"),
        "bad backward",
    ),
    "its backward returns too few gradients": (
        OWN_BACKWARD.format(backward="        return grad.new_zeros(ctx.saved_tensors[0].shape)\n"),
        "incorrect number of gradients",
    ),
    "its forward exits": (
        LOGITS + "def k(logits, targets, *, chunk_size=None):\n    sys.exit(5)\n",
        "called sys.exit(5)",
    ),
    "a result whose __torch_function__ refuses all": (
        LOGITS + "class T(torch.Tensor):\n"
        "    @classmethod\n"
        "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
        "        return NotImplemented\n"
        "def k(logits, targets, *, chunk_size=None):\n"
        "    return _u(logits, targets).as_subclass(T)\n",
        "cannot read",
    ),
}


@pytest.mark.parametrize("what", STEP_BLAME)
def test_step_names_the_kernel_for_what_the_kernel_did(run_cli: Any, here: Path, what: str) -> None:
    body, said = STEP_BLAME[what]
    kernel = user_module(here, "r21_blame", body) + ":k"
    (here / "config.json").write_text(json.dumps(SMALL))
    line = one_line(
        *run_cli("step", "--config", "config.json", "--tokens", "8", "--kernel", kernel)
    )
    assert said in line and "config" not in line and "the step called" not in line


# -- user code that took off a torch dispatch mode it did not push (``_pop_mode()``),
# memprobe's allocation tracker among them: a step failed as memprobe left its tracker,
# with torch's "trying to pop from empty mode stack" and a hint about meta tensors'
# values; a marked test body failed in torch's traceback, and one that allocated after the
# pop was measured without it. The modes are put back, and the code's failure says so.

POPS = {
    "_pop_mode()": "    from torch.utils._python_dispatch import _pop_mode\n    _pop_mode()\n",
    "torch._C's own pop": "    torch._C._pop_torch_dispatch_stack(None)\n",
}
ALLOCATES = "    x = torch.zeros(64, 64, device=device)\n    (x @ x).sum()\n"


@pytest.mark.parametrize("what", POPS)
@pytest.mark.parametrize("when", ["before it allocates", "after"])
def test_a_step_taking_off_memprobes_tracker_is_told_so(
    run_cli: Any, here: Path, what: str, when: str
) -> None:
    body = POPS[what] + ALLOCATES if when != "after" else ALLOCATES + POPS[what]
    step = user_module(here, "r21_pop", "import torch\ndef step(device):\n" + body) + ":step"
    line = one_line(*run_cli("profile", step, "--out", "s.pickle"))
    assert "of the torch dispatch modes" in line and "meta tensors" not in line
    assert not (here / "s.pickle").exists()


@pytest.mark.parametrize("what", POPS)
def test_a_kernel_taking_off_memprobes_tracker_is_its_failure(
    run_cli: Any, here: Path, what: str
) -> None:
    body = LOGITS + "def k(logits, targets, *, chunk_size=None):\n"
    body += POPS[what] + "    return _u(logits, targets)\n"
    kernel = user_module(here, "r21_popk", body) + ":k"
    code, out, _ = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert "dispatch modes" in rows[0]["note"]
    assert "dispatch modes" in one_line(*run_cli(*PLAN, "--kernel", kernel))


@pytest.mark.multiprocess
def test_a_marked_body_taking_off_the_tracker_fails_in_one_message(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_popped=(
            "import pytest, torch\n"
            "from torch.utils._python_dispatch import _pop_mode\n"
            "@pytest.mark.limit_peak_memory('1 KiB')\n"
            "def test_pops():\n"
            "    _pop_mode()\n"
            "    torch.zeros(1 << 20)\n"
            "def test_next():\n"
            "    from torch.utils._python_dispatch import _len_torch_dispatch_stack\n"
            "    assert _len_torch_dispatch_stack() == 0\n"
        )
    )
    result = forked_pytest(pytester, "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, passed=1)
    text = result.stdout.str()
    assert "took off 1 of the torch dispatch modes" in text and "Traceback" not in text
    assert "empty mode stack" not in text
