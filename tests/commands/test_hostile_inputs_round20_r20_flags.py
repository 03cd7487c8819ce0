"""Hostile inputs, round 20 (flags, the process environment, user code): each row is a
variant of a defect class the pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_KERNEL, TINY_STEP, one_line, user_module
from small_config import SMALL

pytest_plugins = ["pytester"]

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--device", "meta",
         "--no-verify", "--no-report", "--json"]  # fmt: skip

LOGITS = (
    "import torch\nfrom memprobe.kernels import get_kernel\n_u = get_kernel('unchunked')\n"
    "def k(logits, targets, *, chunk_size=None):\n"
)

# -- a kernel whose result is the right shape and dtype but that memprobe cannot run
# backward through: detached, made under torch.no_grad(), the logits' requires_grad turned
# off inside the kernel, a fresh leaf or a Parameter, or made on another device (a
# torch.zeros(shape) that forgot device=). Each case failed with torch's words from deep
# inside autograd ("element 0 of tensors does not require grad", "appears to not have been
# used in the graph"); `plan` and a what-if repeated them, and `step` blamed the model's
# config.json ("check the config's sizes") for a result of the kernel's (a wrongly shaped
# one too).

ODD_GRAPH = {
    "detached": ("    return _u(logits, targets).detach()\n", "does not require grad"),
    "under no_grad": (
        "    with torch.no_grad():\n        return _u(logits, targets)\n",
        "does not require grad",
    ),
    # (in `step` the logits are not a leaf: torch refuses the call itself, in its words)
    "requires_grad turned off": (
        "    logits.requires_grad_(False)\n    return _u(logits, targets)\n",
        "requires_grad",
    ),
    "a Parameter": (
        "    return torch.nn.Parameter(_u(logits, targets).detach())\n",
        "is a leaf",
    ),
    "a fresh leaf": (
        "    return torch.ones(targets.shape, device=logits.device, requires_grad=True)\n",
        "is a leaf",
    ),
    "made on the cpu": (
        "    return torch.zeros(targets.shape, requires_grad=True) * 2\n",
        "on cpu, its inputs are on meta",
    ),
}


@pytest.mark.parametrize("what", ODD_GRAPH)
def test_a_result_memprobe_cannot_run_backward_through_is_named(
    run_cli: Any, here: Path, what: str
) -> None:
    body, said = ODD_GRAPH[what]
    kernel = user_module(here, "r20_graph", LOGITS + body) + ":k"
    code, out, _ = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert said in rows[0]["note"] and "autograd" not in rows[0]["note"].split(":")[0]
    plan = ["plan", "--vocab", "128", "--budget", "1MiB", "--no-reserved", "--kernel", kernel]
    assert said in one_line(*run_cli(*plan))
    (here / "config.json").write_text(json.dumps(SMALL))
    step = ["step", "--config", "config.json", "--tokens", "8", "--kernel", kernel]
    line = one_line(*run_cli(*step))
    assert said in line and "config" not in line


# ... a wrongly shaped result, or an exception the user's kernel raises, in `step` is the
# kernel's line too, not the config's.
STEP_OWN = {
    "a wrong shape": ("    return _u(logits, targets)[None]\n", "log-prob kernel failed"),
    "a ValueError": ("    raise ValueError('my own check')\n", "my own check"),
    "a value read on meta": (
        "    logits.sum().item()\n    return _u(logits, targets)\n",
        "failed in the meta simulation",
    ),
}


@pytest.mark.parametrize("what", STEP_OWN)
def test_a_step_kernel_that_fails_does_not_blame_the_config(
    run_cli: Any, here: Path, what: str
) -> None:
    body, said = STEP_OWN[what]
    kernel = user_module(here, "r20_own", LOGITS + body)
    (here / "config.json").write_text(json.dumps(SMALL))
    step = ["step", "--config", "config.json", "--tokens", "8", "--kernel", f"{kernel}:k"]
    line = one_line(*run_cli(*step))
    assert said in line and "config" not in line


# ... while results autograd can run through still measure: a view, another float dtype,
# a torch.Tensor subclass, a hook on the result, a kernel that changes its targets.
STILL_GRAPHS = {
    "float64": "    return _u(logits, targets).double()\n",
    "a subclass": "    class S(torch.Tensor):\n        pass\n"
    "    return _u(logits, targets).as_subclass(S)\n",
    "a hooked result": "    r = _u(logits, targets)\n    r.register_hook(lambda g: g)\n"
    "    return r\n",
    "a view": "    return _u(logits, targets)[:, :]\n",
}


@pytest.mark.parametrize("what", STILL_GRAPHS)
def test_results_autograd_can_run_through_still_measure(
    run_cli: Any, here: Path, what: str
) -> None:
    kernel = user_module(here, "r20_still", LOGITS + STILL_GRAPHS[what]) + ":k"
    code, out, _ = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0
    assert [r["status"] for r in json.loads(out)["results"]] == ["ok", "ok"]


def test_the_tiny_kernel_still_runs_in_a_step(run_cli: Any, here: Path) -> None:
    kernel = user_module(here, "r20_tiny", TINY_KERNEL) + ":k"
    (here / "config.json").write_text(json.dumps(SMALL))
    code, _, _ = run_cli("step", "--config", "config.json", "--tokens", "8", "--kernel", kernel)
    assert code == 0


# -- a negative zero percentage (--max-regression -0, or max_regression = -0.0 in the
# TOML) passed the "zero or more" check, and the gate's lines said "max regression -0%".

NEGATIVE_ZERO = {
    "--max-regression -0": (["--max-regression", "-0"], None),
    "--max-regression -0.0": (["--max-regression", "-0.0"], None),
    "max_regression = -0.0": ([], "[tool.memprobe.gate]\nmax_regression = -0.0\n"),
}


@pytest.mark.parametrize("what", NEGATIVE_ZERO)
def test_a_negative_zero_regression_reads_as_zero(
    run_cli: Any, here: Path, made_run: Path, what: str
) -> None:
    flags, toml = NEGATIVE_ZERO[what]
    if toml is not None:
        (here / "pyproject.toml").write_text(toml)
        flags = [*flags, "--config", "pyproject.toml"]
    base = str(
        shutil.copy(made_run / "results.json", here / "base.json")
    )  # a copy: the gated run as its own baseline is refused
    code, out, _ = run_cli("gate", str(made_run), "--baseline", base, *flags)
    # "-0%", not "-0": the paths printed hold pytest's "pytest-0" on a fresh machine
    assert code == 0 and "max regression 0%" in out and "-0%" not in out


# -- the pytest marker's arguments: a wrong one failed the test's setup with its words
# twice, the second time after pytest's "During handling of the above exception, another
# exception occurred:" (memprobe's own exception chained in); and device=torch.device(
# "meta"), the object torch code names devices with, was "unknown device
# device(type='meta')".

MARKED = {
    "a bool limit": ("True", "limit True is not a size", "error"),
    "a float limit": ("1.5", "is not a whole number of bytes", "error"),
    "an unknown device": ("'1 MiB', device='tpu'", "unknown device 'tpu'", "error"),
    "a torch.device": ("'1 MiB', device=torch.device('meta')", None, "passed"),
    "a torch.device over": (
        "'1 KiB', device=torch.device('meta')",
        "peaked at 4.00 KiB on meta",
        "failed",
    ),
    "a cuda:1 torch.device": (
        "'1 MiB', device=torch.device('cuda', 1)",
        "unknown device 'cuda:1'",
        "error",
    ),
}


def test_the_markers_arguments_fail_once_or_measure(pytester: pytest.Pytester) -> None:
    from importlib.metadata import entry_points

    installed = any(
        ep.value == "memprobe.commands.pytest_plugin" for ep in entry_points(group="pytest11")
    )
    body = ["import pytest, torch\n"]
    for i, (args, _, _) in enumerate(MARKED.values()):
        body.append(
            f"@pytest.mark.limit_peak_memory({args})\ndef test_{i:02}():\n    torch.empty(1024)\n"
        )
    pytester.makepyfile(test_marked="\n".join(body))
    args = () if installed else ("-p", "memprobe.commands.pytest_plugin")
    # In this process (a fresh one cost 3 s of CPU): what a marked body imports lazily is
    # imported first, as an in-process pytester run drops the modules first imported
    # during it, and torch's crash when imported again.
    import torch

    from memprobe.measure.tracker import AllocationTracker

    with AllocationTracker():
        torch.empty(2, 3, device="meta").float()
    result = pytester.runpytest("-p", "no:cacheprovider", "-rA", *args)
    out = result.stdout.str()
    assert "During handling" not in out
    counts = {k: sum(v[2] == k for v in MARKED.values()) for k in ("passed", "failed", "error")}
    result.assert_outcomes(passed=counts["passed"], failed=counts["failed"], errors=counts["error"])
    for _, said, _ in MARKED.values():
        if said is not None:
            assert out.count(said) >= 1, (said, out)


# -- an output path that is a symbolic link: the write moved its file onto the link itself,
# replacing the link with a file and leaving the file it named as it was. `--out
# /dev/stdout` run as root with standard output a file swapped the system's /dev/stdout
# link for a snapshot. Now the write goes through the link to the file it names.

LINKED = {
    "profile --out": (["profile", "STEP", "--out", "LINK"], "real.pickle"),
    "profile --html": (["profile", "STEP", "--html", "LINK"], "real.html"),
    "step --out": (
        ["step", "--config", "config.json", "--tokens", "8", "--out", "LINK"],
        "real.pickle",
    ),
    "gate --junit-xml": (["gate", "RUN", "--baseline", "BASE", "--junit-xml", "LINK"], "real.xml"),
}


@pytest.mark.parametrize("dangling", [False, True], ids=["to a file", "dangling"])
@pytest.mark.parametrize("what", LINKED)
def test_an_output_through_a_link_is_written_where_it_points(
    run_cli: Any, here: Path, made_run: Path, what: str, dangling: bool
) -> None:
    argv, name = LINKED[what]
    real = here / "real" / name
    # An earlier output of memprobe's own: a page replaces only a page memprobe wrote.
    earlier = b'<meta name="generator" content="memprobe">old' if name.endswith(".html") else b"old"
    if not dangling:
        real.parent.mkdir()
        real.write_bytes(earlier)
    link = here / "link"
    link.symlink_to(real)
    (here / "config.json").write_text(json.dumps(SMALL))
    step = user_module(here, "r20_linked", TINY_STEP) + ":step"
    swap = {"LINK": str(link), "STEP": step, "RUN": str(made_run)}
    swap["BASE"] = str(
        shutil.copy(made_run / "results.json", here / "base.json")
    )  # a copy: the gated run as its own baseline is refused
    code, _, _ = run_cli(*[swap.get(a, a) for a in argv])
    assert code == 0
    assert link.is_symlink() and real.is_file() and real.read_bytes() != earlier


# -- a step that lowered its recursion limit to a few frames above its own depth: it runs
# without memprobe, but memprobe's tracker runs Python for every op, and the RecursionError
# was blamed on meta ("meta tensors hold no values: ... .item() ..."). The line now names
# the recursion limit.

LOW_LIMITS = {
    "20 frames above": "sys.setrecursionlimit(_depth() + 20)",
    "5 frames above": "sys.setrecursionlimit(_depth() + 5)",
}


@pytest.mark.parametrize("what", LOW_LIMITS)
def test_a_step_near_its_recursion_limit_is_told_so(run_cli: Any, here: Path, what: str) -> None:
    body = (
        "import sys, torch\n"
        "def _depth():\n    f, n = sys._getframe(), 0\n"
        "    while f:\n        f, n = f.f_back, n + 1\n    return n\n"
        f"def step(device):\n    {LOW_LIMITS[what]}\n"
        "    w = torch.zeros(8, 8, device=device, requires_grad=True)\n"
        "    (w @ w).sum().backward()\n"
    )
    line = one_line(*run_cli("profile", user_module(here, "r20_limit", body) + ":step"))
    assert "RecursionError" in line and "setrecursionlimit" in line and ".item()" not in line
