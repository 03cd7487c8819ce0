"""Hostile inputs, round 17 (flags, the process environment, user code): each row is a
variant of a defect class the pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import atexit
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_STEP, user_module
from launch import forked_torchrun

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--device", "meta",
         "--no-verify", "--no-report", "--json"]  # fmt: skip


# -- functions user code registers with atexit: they run after memprobe's answer, as the
# process ends, and what they printed went to standard output after `--json`'s object,
# no longer JSON. They run with their output on standard error, as the code did.

AT_EXIT = {
    "at the step's import": ("import atexit\natexit.register(bye, 'bye')\n", ""),
    "imported by name": ("from atexit import register\nregister(bye, 'bye')\n", ""),
    "as a decorator": ("import atexit\n@atexit.register\ndef bye2():\n    bye('bye')\n", ""),
    "in the step": ("import atexit\n", "    atexit.register(bye, 'bye')\n"),
}


@pytest.mark.parametrize("where", AT_EXIT)
def test_what_user_code_registers_with_atexit_prints_on_stderr(
    run_cli: Any, here: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    from memprobe.kernels import user_guards

    top, inside = AT_EXIT[where]
    body = "def bye(text):\n    print(text)\n" + top
    body += TINY_STEP.replace("def step(device):\n", "def step(device):\n" + inside)
    name = user_module(here, "r17_atexit", body)
    code, out, _ = run_cli("profile", name + ":step", "--json")
    assert code == 0 and json.loads(out)
    assert atexit.register is user_guards._REGISTER  # put back once the code returned
    mine = getattr(sys.modules[name], "bye2", sys.modules[name].bye)
    added = [f for f in user_guards._SHIELDED.get(id(mine), []) if f.__wrapped__ is mine]
    assert len(added) == 1
    capsys.readouterr()
    added[0]()  # as the interpreter will at its end
    atexit.unregister(added[0])
    out, err = capsys.readouterr()
    assert out == "" and err == "bye\n"


@pytest.mark.parametrize(
    ("raises", "says"),
    [("raise RuntimeError('gone')", "RuntimeError: gone"), ("sys.exit(3)", "SystemExit: 3")],
)
def test_an_atexit_function_that_fails_is_one_line(
    run_cli: Any, here: Path, capsys: pytest.CaptureFixture[str], raises: str, says: str
) -> None:
    """Python printed its traceback after memprobe's answer (and exited 0 all the same)."""
    from memprobe.kernels import user_guards

    body = f"import atexit, sys\ndef bye():\n    {raises}\natexit.register(bye)\n" + TINY_STEP
    name = user_module(here, "r17_fails", body)
    assert run_cli("profile", name + ":step")[0] == 0
    (shielded,) = user_guards._SHIELDED[id(sys.modules[name].bye)]
    shielded()
    atexit.unregister(shielded)
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    said = "memprobe: warning: bye, registered with atexit by user code, raised "
    assert err == f"{said}{says} as the process ended\n"


def test_atexit_unregister_in_user_code_finds_what_it_registered(run_cli: Any, here: Path) -> None:
    from memprobe.kernels import user_guards

    body = (
        "import atexit\ndef bye():\n    print('bye')\n"
        "atexit.register(bye)\natexit.register(bye)\natexit.unregister(bye)\n" + TINY_STEP
    )
    name = user_module(here, "r17_unreg", body)
    assert run_cli("profile", name + ":step")[0] == 0
    assert id(sys.modules[name].bye) not in user_guards._SHIELDED


# -- standard error closed (`2>&-`): Python starts with no sys.stderr, so what user code
# printed (sent to standard error while it runs) stayed on standard output, and so did
# what it wrote to descriptor 1: `--json`'s object was no longer JSON. Each closed
# descriptor is now opened on /dev/null.


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "body",
    [
        "print('at import')\n",
        "import os\nos.write(1, b'below sys.stdout')\n",
    ],
    ids=["print", "os.write(1)"],
)
def test_with_stderr_closed_user_output_stays_off_stdout(here: Path, body: str) -> None:
    name = user_module(
        here,
        "r17_closed",
        body + "from memprobe.kernels import get_kernel\n"
        "def k(logits, targets, *, chunk_size=None):\n"
        "    print('in the kernel')\n"
        "    return get_kernel('unchunked')(logits, targets)\n",
    )
    done = forked_torchrun(
        [*SWEEP, "--kernel", f"{name}:k", "--out", "run"],
        cwd=here,
        nproc=0,
        timeout=60,
        stderr="closed",
    )
    assert done.returncode == 0, done
    assert json.loads(done.stdout)["results"][0]["status"] == "ok"


# -- torch's functions replaced by user code (a monkeypatch in the kernel, a library's
# `F.log_softmax = fast` as its module is imported): memprobe's own kernels ran the
# replacement in every case after the code's, their peaks reported as theirs (unchunked
# read 64 KiB where it holds 112 KiB, ok). The replacement is the user code's alone.

REPLACED = {
    "a Tensor method in the kernel": ("", "    torch.Tensor.float = lambda self: self\n"),
    "a Tensor method at import": ("torch.Tensor.float = lambda self: self\n", ""),
    "a torch function at import": ("torch.log_softmax = lambda x, *a, **k: x\n", ""),
    "an F function in the kernel": ("", "    F.log_softmax = lambda x, *a, **k: x\n"),
}


def _peaks(run: Path) -> dict[str, int]:
    rows = json.loads((run / "results.json").read_text())["rows"]
    return {row["kernel"]: row["peak_bytes"] for row in rows}


@pytest.mark.parametrize("where", REPLACED)
def test_torch_functions_user_code_replaces_are_its_own(
    run_cli: Any, here: Path, where: str
) -> None:
    import torch
    import torch.nn.functional as F

    kept = torch.Tensor.float, torch.log_softmax, F.log_softmax
    top, inside = REPLACED[where]
    name = user_module(
        here,
        "r17_patch",
        "import torch\nimport torch.nn.functional as F\n" + top + "from memprobe.kernels import "
        "get_kernel\ndef k(logits, targets, *, chunk_size=None):\n" + inside + "    return "
        "get_kernel('unchunked')(logits, targets)\n",
    )
    swept = [*SWEEP[:-1], "--out", "run", "-q"]
    assert run_cli(*swept[:-3], "--kernel", "unchunked", "--out", "alone", "-q")[0] == 0
    assert run_cli(*swept, "--kernel", f"{name}:k,unchunked")[0] == 0
    assert _peaks(here / "run")["unchunked"] == _peaks(here / "alone")["unchunked"]
    assert (torch.Tensor.float, torch.log_softmax, F.log_softmax) == kept


def test_a_kernel_keeps_seeing_what_its_module_replaced(run_cli: Any, here: Path) -> None:
    name = user_module(
        here,
        "r17_sees",
        "import torch.nn.functional as F\nfrom memprobe.kernels import get_kernel\n"
        "def fast(*a, **k):\n    return fast.own(*a, **k)\nfast.own = F.log_softmax\n"
        "F.log_softmax = fast\n"
        "def k(logits, targets, *, chunk_size=None):\n"
        "    assert F.log_softmax is fast, 'the module replaced it'\n"
        "    return get_kernel('unchunked')(logits, targets)\n",
    )
    kernels = f"{name}:k,unchunked,{name}:k"
    assert run_cli(*SWEEP[:-1], "-q", "--kernel", kernels, "--out", "r")[0] == 0
    rows = json.loads((here / "r" / "results.json").read_text())["rows"]
    assert [row["status"] for row in rows] == ["ok", "ok"]
