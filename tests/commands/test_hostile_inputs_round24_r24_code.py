"""Hostile inputs, round 24 (user code memprobe imports and runs: a user's kernel, a
user's step, the module each lives in): each row is a variant of a defect class the pass
found. One line and exit 2, the case's error row, or a sane answer."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, user_module
from launch import forked_torchrun
from small_config import SMALL

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


# -- functions a kernel's module replaced as it was imported, outside torch, torch.Tensor,
# torch.nn.functional and the builtins (the namespaces kept so far): in the standard
# library memprobe's own work calls, sys.exit replaced by a no-op turned plan's error line
# into exit 0 (a CI job passed), time.perf_counter = None failed memprobe's own kernels'
# rows on cpu, os.replace or tempfile.mkstemp raising failed the sweep's run.json
# ("cannot write"), json.dumps replaced wrote its text as sweep --json's output; in
# torch.nn and torch.optim, `memprobe step` built memprobe's model with the module's
# torch.nn.Linear, or its torch.optim.AdamW, and reported that model's peak. Each is the
# module's own, swapped in while its code runs.

NO_OP_EXIT = "sys.exit = lambda *a: None"
NO = "def _no(*a, **k):\n    raise PermissionError('not here')\n"
STDLIB = {
    "os.replace raising": NO + "os.replace = _no",
    "tempfile.mkstemp raising": NO + "import tempfile\ntempfile.mkstemp = _no",
    "json.dumps replaced": "import json\njson.dumps = lambda *a, **k: 'garbage'",
    "os.path.exists always False": "os.path.exists = lambda p: False",
    "shutil.move raising": NO + "import shutil\nshutil.move = _no",
}


@pytest.mark.parametrize("what", STDLIB)
def test_a_modules_stdlib_replacements_are_not_memprobes(
    run_cli: Any, here: Path, what: str
) -> None:
    kernel = _kernel(here, "r24_stdlib", STDLIB[what])
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked", "--out", "run")
    assert code == 0, err
    rows = _rows(out)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert json.loads((here / "run" / "results.json").read_text())


def test_a_no_op_sys_exit_does_not_pass_an_error(run_cli: Any, here: Path) -> None:
    kernel = _kernel(here, "r24_exit", NO_OP_EXIT, "raise ValueError('broken')")
    assert "broken" in one_line(*run_cli(*PLAN, "--kernel", kernel))
    step = user_module(
        here, "r24_exitstep", f"import sys\n{NO_OP_EXIT}\ndef step(device):\n    1/0\n"
    )
    one_line(*run_cli("profile", f"{step}:step", "--out", "s.pickle"))


def test_memprobes_own_kernel_is_timed_by_its_own_clock(run_cli: Any, here: Path) -> None:
    kernel = _kernel(here, "r24_clock", "import time\ntime.perf_counter = None")
    flags = ["--device", "cpu", "--no-report", "--json", "--no-ladder", "--out", "run"]
    code, out, err = run_cli("sweep", "--tokens", "16", "--vocab", "32", *flags,
                             "--kernel", f"{kernel},unchunked")  # fmt: skip
    assert code == 0, err
    assert _rows(out)[1]["status"] == "ok"


def test_the_module_still_sees_its_own_replacement(run_cli: Any, here: Path) -> None:
    pre = "import time\n_mine = lambda: 0.0\ntime.monotonic = _mine"
    body = "assert time.monotonic is _mine\n    return _u(logits, targets)"
    kernel = _kernel(here, "r24_sees", pre, body)
    code, out, err = run_cli(*SWEEP, "--kernel", kernel)
    assert code == 0, err
    assert _rows(out)[0]["status"] == "ok", _rows(out)[0]["note"]


# -- what a kernel's module left as it was imported, in `memprobe step`'s model: the model
# is memprobe's own, yet its step ran as "the step", user code, with all the module left
# lent to it: a global nn.Module hook (forward, forward pre, full backward, parameter or
# buffer registration) or optimizer hook the module registered ran in the model, and
# one that raised failed the step as "the model built from config.json cannot run this op:
# check the config's sizes"; a replaced F.scaled_dot_product_attention, torch.nn.Linear or
# torch.optim.AdamW ran in it, and its peak was reported as the model's. The model runs in
# memprobe's state; the user's kernel in its module's.

RAISE = "(_ for _ in ()).throw(RuntimeError('hook says no'))"
MODULE_HOOKS = "from torch.nn.modules import module as M\n"
LEFT_IN_STEP = {
    "a forward pre-hook": f"M.register_module_forward_pre_hook(lambda m, a: {RAISE})",
    "a forward hook": f"M.register_module_forward_hook(lambda m, a, o: {RAISE})",
    "an always-called forward hook": (
        f"M.register_module_forward_hook(lambda m, a, o: {RAISE}, always_call=True)"
    ),
    "a full backward hook": f"M.register_module_full_backward_hook(lambda m, i, o: {RAISE})",
    "a parameter registration hook": (
        f"M.register_module_parameter_registration_hook(lambda m, n, p: {RAISE})"
    ),
    "a buffer registration hook": (
        f"M.register_module_buffer_registration_hook(lambda m, n, b: {RAISE})"
    ),
    "an optimizer step hook": (
        "import torch.optim.optimizer as O\n"
        f"O.register_optimizer_step_pre_hook(lambda o, a, k: {RAISE})"
    ),
    "F.scaled_dot_product_attention replaced": (
        "import torch.nn.functional as F\n"
        "def _no(*a, **k):\n    raise RuntimeError('no attention')\n"
        "F.scaled_dot_product_attention = _no"
    ),
    "torch.nn.Linear replaced": (
        "class L(torch.nn.Linear):\n"
        "    def forward(self, x):\n"
        "        torch.empty(1 << 22, device=x.device)\n"
        "        return super().forward(x)\n"
        "torch.nn.Linear = L"
    ),
    "torch.optim.AdamW replaced": "torch.optim.AdamW = torch.optim.SGD",
}


@pytest.fixture
def baseline_step(run_cli: Any, here: Path) -> tuple[Path, dict[str, Any]]:
    (here / "config.json").write_text(json.dumps(SMALL))
    kernel = _kernel(here, "r24_plain")
    code, out, err = run_cli("step", "--config", "config.json", "--tokens", "64",
                             "--kernel", kernel, "--json")  # fmt: skip
    assert code == 0, err
    return here / "config.json", json.loads(out)


# Left at once, in two groups (each hook raises, so any one run in the model fails it):
# the hooks go through one guard, the replaced names through another.
LEFT_GROUPS = {
    "hooks": [name for name in LEFT_IN_STEP if "hook" in name],
    "replaced": [name for name in LEFT_IN_STEP if "replaced" in name],
}


@pytest.mark.parametrize("group", LEFT_GROUPS)
def test_what_a_kernels_module_left_is_not_in_memprobes_model(
    run_cli: Any, here: Path, baseline_step: tuple[Path, dict[str, Any]], group: str
) -> None:
    assert sorted(sum(LEFT_GROUPS.values(), [])) == sorted(LEFT_IN_STEP)
    config, expected = baseline_step
    left = "\n".join(LEFT_IN_STEP[what] for what in LEFT_GROUPS[group])
    kernel = _kernel(here, "r24_left", MODULE_HOOKS + left)
    code, out, err = run_cli("step", "--config", str(config), "--tokens", "64",
                             "--kernel", kernel, "--json")  # fmt: skip
    assert code == 0, err
    got = json.loads(out)
    assert got["peak_allocated_bytes"] == expected["peak_allocated_bytes"]
    assert got["peak_phase"] == expected["peak_phase"]


def test_a_steps_module_hook_still_runs_in_its_step(run_cli: Any, here: Path) -> None:
    body = (
        "import torch\nfrom torch.nn.modules import module as M\nseen = []\n"
        "M.register_module_forward_hook(lambda m, a, o: seen.append(m))\n"
        "def step(device):\n"
        "    torch.nn.Linear(4, 4, device=device)(torch.zeros(1, 4, device=device))\n"
        "    assert seen, 'the module hook did not run'\n"
    )
    step = user_module(here, "r24_hookstep", body)
    code, _, err = run_cli("profile", f"{step}:step", "--out", "s.pickle")
    assert code == 0, err
    from torch.nn.modules import module

    assert not module._global_forward_hooks  # and it is not left for what comes after


# -- sys.path_importer_cache, the finder Python keeps for each sys.path entry: a module
# that set an entry to None ("no finder here") or to a finder that raised left memprobe
# unable to import from site-packages after it, and the sweep ended in a traceback from
# pandas writing results.csv (round 19 put back the finders and hooks it removed; this
# cache was left as the module made it).

CACHE = {
    "every entry None": (
        "for _p in list(sys.path_importer_cache):\n    sys.path_importer_cache[_p] = None"
    ),
    "a raising finder for site-packages": (
        "class _F:\n"
        "    def find_spec(self, *a, **k):\n        raise ImportError('blocked')\n"
        "    def invalidate_caches(self): pass\n"
        "for _p in list(sys.path_importer_cache):\n"
        "    if 'site-packages' in _p: sys.path_importer_cache[_p] = _F()"
    ),
    "the cache replaced": "sys.path_importer_cache = {_p: None for _p in sys.path}",
}


@pytest.mark.parametrize("what", CACHE)
def test_the_finders_python_cached_are_put_back(what: str) -> None:
    from memprobe.kernels.user import user_code

    before = dict(sys.path_importer_cache)
    with user_code("mine:k"):
        exec(CACHE[what], {"sys": sys})
    assert sys.path_importer_cache is not None
    for path, finder in before.items():
        assert sys.path_importer_cache.get(path, finder) is finder, path


@pytest.mark.multiprocess
def test_a_sweep_ends_well_after_a_poisoned_finder_cache(here: Path) -> None:
    # In a process of its own (forked from tests/launch.py's server, where pandas is
    # imported but has written no CSV): in this one, pandas' lazy imports were made by
    # earlier tests.
    name = _kernel(here, "r24_cache", CACHE["every entry None"])
    flags = ["--kernel", f"{name},unchunked", "--device", "cpu", "--no-report", "--out", "o"]
    argv = ["sweep", "--tokens", "16", "--vocab", "32", "--no-ladder", "-q", *flags]
    done = forked_torchrun(argv, cwd=here, nproc=0, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert (here / "o" / "results.csv").exists()


# -- the signals user code blocked and left blocked (signal.pthread_sigmask, a critical
# section it never left): its handlers were put back, but not the mask, so memprobe,
# after a kernel that blocked SIGINT and SIGTERM, ignored Ctrl-C and torchrun's stop for
# the rest of the run. The mask is put back as the handlers are.

MASKS = {
    "SIGINT and SIGTERM blocked": (
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})"
    ),
    "every signal blocked": "signal.pthread_sigmask(signal.SIG_SETMASK, signal.valid_signals())",
    "SIGINT blocked, then a raise": (
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}); raise ValueError('x')"
    ),
}


@pytest.mark.parametrize("what", MASKS)
def test_the_signals_user_code_blocked_are_unblocked(what: str) -> None:
    import contextlib
    import signal

    from memprobe.kernels.user import user_code

    before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    with contextlib.suppress(ValueError), user_code("mine:k"):
        exec(MASKS[what], {"signal": signal})
    assert signal.pthread_sigmask(signal.SIG_BLOCK, ()) == before


def test_a_plan_after_a_blocking_kernel_can_be_stopped(run_cli: Any, here: Path) -> None:
    import signal

    body = "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n    " + RETURNS
    kernel = _kernel(here, "r24_mask", "import signal", body)
    code, _, err = run_cli(*PLAN, "--kernel", kernel)
    assert code == 0, err
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, ())
