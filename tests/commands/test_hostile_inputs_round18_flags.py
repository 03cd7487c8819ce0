"""Hostile inputs, round 18 (flags, the process environment, user code): each row is a
variant of a defect class the pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_STEP, user_module

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--device", "meta",
         "--no-verify", "--no-report", "--json"]  # fmt: skip


def _kernel(top: str, inside: str = "") -> str:
    return (
        "import io, logging, os, sys\nfrom memprobe.kernels import get_kernel\n" + top + "\n"
        "def k(logits, targets, *, chunk_size=None):\n" + inside + "    return "
        "get_kernel('unchunked')(logits, targets)\n"
    )


# -- the root logger user code configured (``logging.basicConfig(stream=sys.stdout,
# level=logging.DEBUG)`` as its module is imported, a handler on sys.__stdout__): every
# record of what memprobe ran after it went through it, matplotlib's DEBUG lines drawing
# a sweep's report or `profile --html`'s page went into `--json`'s object on standard
# output (and hundreds of them onto standard error with the default stream). The root's
# handlers and level are the code's only while it runs.

LOGGING = {
    "basicConfig at import": (
        "sink = io.StringIO()\n"
        "logging.basicConfig(stream=sink, level=1, force=True, format='%(message)s')\n",
        "",
    ),
    "a handler added in the kernel": (
        "sink = io.StringIO()\nadded = []\n",
        "    if not added:\n"
        "        added.append(logging.StreamHandler(sink))\n"
        "        logging.getLogger().addHandler(added[0])\n"
        "        logging.getLogger().setLevel(1)\n",
    ),
}


@pytest.mark.parametrize("where", LOGGING)
def test_the_root_logger_user_code_configured_is_its_own(
    run_cli: Any, here: Path, where: str
) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    top, inside = LOGGING[where]
    # The kernel logs, and sees its handler again at its second case.
    inside += "    logging.getLogger('mine').warning('from the kernel')\n"
    name = user_module(here, "r18_logging", _kernel(top, inside))
    code, out, _ = run_cli(*SWEEP, "--kernel", f"{name}:k,unchunked", "--tokens", "64,128")
    assert code == 0 and json.loads(out)
    assert (root.handlers, root.level) == (handlers, level)
    logging.getLogger("matplotlib").debug("memprobe's own work")  # as drawing a page logs
    sink = sys.modules[name].sink.getvalue()
    assert sink == "from the kernel\n" * 2


def test_the_root_logger_a_step_configured_is_its_own(run_cli: Any, here: Path) -> None:
    body = (
        "import logging, sys\nlogging.basicConfig(stream=sys.stdout, level=1, force=True)\n"
        + TINY_STEP
    )
    name = user_module(here, "r18_log_step", body)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    code, out, _ = run_cli("profile", f"{name}:step", "--json")
    assert code == 0 and json.loads(out)
    assert (root.handlers, root.level) == (handlers, level)


# -- a trace or profile function user code set (sys.settrace, sys.setprofile, threading's)
# and left on: it ran at every call of memprobe's own code after the code returned, what
# it printed went into `--json`'s object, and one that raised ended the command in a
# traceback (exit 1).

TRACING = {
    "sys.settrace at import": ("sys.settrace(hook)\n", ""),
    "sys.setprofile at import": ("sys.setprofile(hook)\n", ""),
    "sys.setprofile in the kernel": ("", "    sys.setprofile(hook)\n"),
    "threading.settrace in the kernel": ("import threading\n", "    threading.settrace(hook)\n"),
}


@pytest.mark.parametrize("where", TRACING)
def test_a_trace_function_user_code_set_is_put_back(run_cli: Any, here: Path, where: str) -> None:
    import threading

    top, inside = TRACING[where]
    hook = (
        "def hook(frame, event, arg):\n"
        "    if frame.f_code.co_name == 'dumps':\n"
        "        raise RuntimeError('traced memprobe')\n"
    )
    kept = sys.gettrace(), sys.getprofile(), threading.gettrace(), threading.getprofile()
    name = user_module(here, "r18_trace", _kernel(hook + top, inside))
    code, out, err = run_cli(*SWEEP, "--kernel", f"{name}:k,unchunked")
    assert code == 0 and "Traceback" not in err, err
    assert [row["status"] for row in json.loads(out)["results"]] == ["ok", "ok"]
    assert (sys.gettrace(), sys.getprofile(), threading.gettrace(), threading.getprofile()) == kept


# -- the variables that decide how memprobe's own output is drawn (rich reads them), set by
# a kernel: FORCE_COLOR drew a sweep's table on a pipe in terminal escapes, its rules a
# screen wide. They are put back as the code returns, as the other variables memprobe reads.


@pytest.mark.parametrize(
    "setting",
    ["os.environ['FORCE_COLOR'] = '1'", "os.environ['TTY_COMPATIBLE'] = '1'"],
)
def test_a_kernel_setting_colour_variables_leaves_the_table_plain(
    run_cli: Any, here: Path, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    for variable in ("FORCE_COLOR", "TTY_COMPATIBLE", "TERM"):
        monkeypatch.delenv(variable, raising=False)
    name = user_module(here, "r18_colour", _kernel("", f"    {setting}\n"))
    code, out, _ = run_cli(*SWEEP[:-1], "--kernel", f"{name}:k,unchunked", "--out", "r")
    assert code == 0 and "\x1b[" not in out
    assert "FORCE_COLOR" not in os.environ and "TTY_COMPATIBLE" not in os.environ


# -- sys.modules as user code left it: an import blocker (``sys.modules["matplotlib"] =
# None``, the way to make a module unimportable) ended the sweep after its cases in a
# traceback, "import of matplotlib halted; None in sys.modules", as its report was drawn
# (``json`` blocked: as `profile --html` wrote its page). An entry memprobe had that the
# code removed or replaced is memprobe's again as it returns; the code's own are swapped in
# while it runs.

MODULES = {
    "matplotlib blocked in the kernel": ("", "    sys.modules['matplotlib'] = None\n"),
    "a blocker for a module not imported yet": ("sys.modules['email.mime'] = None\n", ""),
    "json replaced at import": ("import types\nsys.modules['json'] = types.ModuleType('j')\n", ""),
}


@pytest.mark.parametrize("where", MODULES)
def test_sys_modules_as_user_code_left_it_is_its_own(run_cli: Any, here: Path, where: str) -> None:
    top, inside = MODULES[where]
    kept = dict(sys.modules)
    name = user_module(here, "r18_modules", _kernel(top, inside))
    code, out, err = run_cli(*SWEEP, "--kernel", f"{name}:k,unchunked", "--tokens", "64,128")
    assert code == 0, err
    assert [row["status"] for row in json.loads(out)["results"]] == ["ok"] * 4
    assert all(sys.modules.get(n) is m for n, m in kept.items())
    assert None not in sys.modules.values()


def test_a_blocker_user_code_left_is_there_when_it_runs_again(run_cli: Any, here: Path) -> None:
    body = _kernel(
        "sys.modules['matplotlib'] = None\n",
        "    assert sys.modules['matplotlib'] is None, 'the module blocked it'\n",
    )
    name = user_module(here, "r18_blocked", body)
    code, out, _ = run_cli(*SWEEP, "--kernel", f"{name}:k,unchunked,{name}:k")
    assert code == 0 and None not in sys.modules.values()
    assert [row["status"] for row in json.loads(out)["results"]] == ["ok", "ok"]


# -- matplotlib's settings as user code left them (rcParams are the process's): a kernel
# that turned on ``text.usetex`` (no LaTeX installed) ended the sweep in a traceback, exit
# 1, as its report was drawn (a step: `profile --html`, as its page was); a style it
# chose (dark_background) drew memprobe's plots. They are drawn over matplotlib's defaults.


def test_a_step_that_turned_on_usetex_leaves_the_page_drawn(run_cli: Any, here: Path) -> None:
    import matplotlib

    kept = matplotlib.rcParams["text.usetex"]
    body = "import matplotlib\nmatplotlib.rcParams['text.usetex'] = True\n" + TINY_STEP
    name = user_module(here, "r18_usetex", body)
    try:
        code, out, err = run_cli("profile", f"{name}:step", "--html", "p.html", "--json")
    finally:
        matplotlib.rcParams["text.usetex"] = kept
    assert code == 0 and "Traceback" not in err, err
    assert json.loads(out) and (here / "p.html").exists()


def test_a_style_user_code_chose_does_not_draw_memprobes_plots() -> None:
    import matplotlib
    import matplotlib.style

    from memprobe.render.canvas import new_figure, styled

    @styled
    def facecolor() -> Any:
        return new_figure(1.0, 1.0).get_facecolor()

    with matplotlib.style.context("dark_background"):
        assert facecolor() == (1.0, 1.0, 1.0, 1.0)


# -- standard error's descriptor closed or redirected by a kernel (``os.close(2)``,
# ``os.dup2(log, 2)`` to catch a C library's messages): memprobe's standard error went with
# it, and the progress line of every case after the kernel's went nowhere. Descriptor 2 is
# memprobe's again as the code returns.


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "inside",
    ["    os.close(2)\n", "    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)\n"],
    ids=["closed", "redirected"],
)
def test_a_kernel_that_closed_stderr_leaves_memprobes_progress(here: Path, inside: str) -> None:
    from launch import forked_torchrun

    name = user_module(here, "r18_fd2", _kernel("", inside))
    done = forked_torchrun(
        [*SWEEP[:-2], "--kernel", f"{name}:k,unchunked", "--tokens", "64,128", "--out", "r"],
        cwd=here,
        nproc=0,
        timeout=60,
    )
    assert done.returncode == 0, done
    assert done.stderr.count("unchunked tokens=") == 2, done.stderr
