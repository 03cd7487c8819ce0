"""Hostile inputs, round 16 (flags, their combinations, user code): each row is a variant
of a defect class the pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, user_module

pytest_plugins = ["pytester"]

SWEEP = ["--tokens", "64", "--vocab", "256", "--no-ladder", "--device", "meta", "-q",
         "--no-verify", "--no-report"]  # fmt: skip


def _rows(run: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads((run / "results.json").read_text())["rows"]
    return rows


# -- torch contexts user code entered and never left: autocast ran memprobe's fp32 linear
# kernels' matmuls in bf16 after the user's (a larger peak and an error of 0.05, reported
# as measured); a save_on_cpu() failed every later kernel on meta ("Cannot copy out of
# meta tensor"), and so did a TorchFunctionMode pushed and left

LEFT_ON = {
    "autocast cpu": "torch.autocast('cpu', dtype=torch.bfloat16).__enter__()",
    "autocast cuda": "torch.set_autocast_enabled('cuda', True)",
    "save_on_cpu": "torch.autograd.graph.save_on_cpu().__enter__()",
    "saved tensor hooks": "torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)"
    ".__enter__()",
    "hooks disabled": "torch.autograd.graph.disable_saved_tensors_hooks('no').__enter__()",
    "function mode": "TorchFunctionMode().__enter__()",
    "two function modes": "TorchFunctionMode().__enter__(); TorchFunctionMode().__enter__()",
    "dispatch mode": "TorchDispatchMode().__enter__()",
}


@pytest.mark.parametrize("what", sorted(LEFT_ON))
def test_torch_contexts_user_code_leaves_on_are_closed(run_cli: Any, here: Path, what: str) -> None:
    import torch

    body = (
        "import torch\nfrom memprobe.kernels import get_kernel\n"
        "from torch.overrides import TorchFunctionMode\n"
        "from torch.utils._python_dispatch import TorchDispatchMode\n"
        "def k(logits, targets, *, chunk_size=None):\n"
        "    out = get_kernel('unchunked')(logits, targets)\n"
        f"    {LEFT_ON[what]}\n"
        "    return out\n"
    )
    kernel = user_module(here, "r16_left_on", body) + ":k"
    code, _, err = run_cli("sweep", *SWEEP, "--kernel", f"{kernel},unchunked,local_chunked",
                           "--out", "o")  # fmt: skip
    assert code == 0, err
    rows = _rows(here / "o")
    assert [r["status"] for r in rows[1:]] == ["ok", "ok"], [r["note"] for r in rows]
    assert rows[1]["peak_bytes"] == 229632  # unchunked's at 64 x 256, as swept alone
    assert not torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled("cuda")
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert torch._C._autograd._saved_tensors_hooks_is_enabled()
    assert torch._C._len_torch_function_stack() == 0
    assert torch._C._len_torch_dispatch_stack() == 0


def test_autocast_left_on_no_longer_changes_the_next_kernels_numbers(
    run_cli: Any, here: Path
) -> None:
    body = (
        "import torch\nfrom memprobe.kernels import get_kernel\n"
        "def k(hidden, weight, targets, *, chunk_size=None):\n"
        "    out = get_kernel('linear_unchunked')(hidden, weight, targets)\n"
        "    torch.autocast('cpu', dtype=torch.bfloat16).__enter__()\n"
        "    return out\n"
    )
    kernel = user_module(here, "r16_autocast", body) + ":k"
    flags = ["--tokens", "16", "--vocab", "64", "--hidden", "16", "--no-ladder", "-q",
             "--device", "cpu", "--dtype", "fp32", "--no-verify", "--no-report"]  # fmt: skip
    code, _, err = run_cli("sweep", *flags, "--kernel", f"{kernel},linear_unchunked", "--out", "o")
    assert code == 0, err
    mine, theirs = _rows(here / "o")
    assert theirs["status"] == "ok" and theirs["peak_bytes"] == mine["peak_bytes"], theirs


# -- a user's hidden-family kernel (hidden, weight, targets) ran with none of the guards a
# logits kernel has: its print() went into `sweep --json`'s object, the gradients it turned
# off failed every later case, its sys.exit(3) ended the sweep with status 3 and no word,
# and a result of the wrong shape failed in autograd ("Mismatch in shape: grad_output[0]")

HIDDEN_HEAD = (
    "import os, sys, torch\nfrom memprobe.kernels import get_kernel\n"
    "def k(hidden, weight, targets, *, chunk_size=None):\n"
    "    out = get_kernel('fused_linear_chunked')(hidden, weight, targets, chunk_size=chunk_size)\n"
)
HIDDEN_CODE = {
    "prints": ('    print(\'{"not": "yours"}\')\n', "ok", ""),
    "writes to descriptor 1": ("    os.write(1, b'garbage')\n", "ok", ""),
    "turns gradients off": ("    torch.set_grad_enabled(False)\n", "ok", ""),
    "changes the default dtype": ("    torch.set_default_dtype(torch.float64)\n", "ok", ""),
    "calls sys.exit": ("    sys.exit(3)\n", "error", "called sys.exit(3) instead of returning"),
    "returns the logits": (
        "    return (hidden @ weight.T).float().log_softmax(-1)\n",
        "error",
        "a kernel returns one floating log-prob per target, shape [1, 64]",
    ),
    "returns a tuple": ("    return out, out\n", "error", "the kernel returned tuple"),
    "returns the targets": ("    return targets\n", "error", "the kernel returned a int64"),
}


@pytest.mark.parametrize("what", sorted(HIDDEN_CODE))
def test_a_hidden_family_user_kernel_is_guarded_as_a_logits_one(
    run_cli: Any, here: Path, what: str
) -> None:
    code_line, status, note = HIDDEN_CODE[what]
    kernel = user_module(here, "r16_hidden", HIDDEN_HEAD + code_line + "    return out\n") + ":k"
    flags = [*SWEEP, "--hidden", "16", "--json"]
    code, out, err = run_cli(
        "sweep", *flags, "--kernel", f"{kernel},linear_unchunked", "--out", "o"
    )
    assert code == 0, err
    assert json.loads(out)["cases"] == 2  # the answer is JSON, and only it
    mine, theirs = _rows(here / "o")
    assert mine["status"] == status and note in mine["note"], mine["note"]
    assert theirs["status"] == "ok" and theirs["peak_bytes"] == 207104, theirs["note"]


# -- a kernel that computes its result in a thread of its own: torch's dispatch modes are
# per thread, so the tracker never saw its forward; the peak was 160 KiB where the kernel's
# is 224 KiB, reported ok. The case is now an error saying why.

THREADED = {
    "a thread pool": (
        "    import concurrent.futures as cf\n"
        "    with cf.ThreadPoolExecutor(1) as ex:\n"
        "        return ex.submit(get_kernel('unchunked'), logits, targets).result()\n"
    ),
    "a thread": (
        "    import threading\n"
        "    box = []\n"
        "    t = threading.Thread(target=lambda: box.append(UNCHUNKED(logits, targets)))\n"
        "    t.start(); t.join()\n"
        "    return box[0]\n"
    ),
    "a result kept from an earlier call": (
        "    global KEPT\n"
        "    if KEPT is None:\n"
        "        import threading\n"
        "        box = []\n"
        "        t = threading.Thread(target=lambda: box.append(UNCHUNKED(logits, targets)))\n"
        "        t.start(); t.join(); KEPT = box[0]\n"
        "    return KEPT\n"
    ),
}


@pytest.mark.parametrize("what", sorted(THREADED))
def test_a_result_made_where_the_tracker_cannot_see_is_an_error(
    run_cli: Any, here: Path, what: str
) -> None:
    body = (
        "from memprobe.kernels import get_kernel\nKEPT = None\n"
        "UNCHUNKED = get_kernel('unchunked')\n"
        "def k(logits, targets, *, chunk_size=None):\n" + THREADED[what]
    )
    kernel = user_module(here, "r16_threaded", body) + ":k"
    code, _, err = run_cli("sweep", *SWEEP, "--kernel", f"{kernel},unchunked", "--out", "o")
    assert code == 0, err
    mine, theirs = _rows(here / "o")
    assert mine["status"] == "error" and mine["peak_bytes"] is None, mine
    assert "allocated where memprobe cannot see it (in another thread" in mine["note"]
    assert theirs["status"] == "ok" and theirs["peak_bytes"] == 229632


ELSEWHERE = {
    "plan": ["plan", "--vocab", "256", "--budget", "1MiB", "--no-reserved", "--kernel", "{k}"],
    "what-if": ["attribute", "{snap}", "--what-if", "{k}"],
    "step": ["step", "--config", "{config}", "--tokens", "64", "--kernel", "{k}"],
}


@pytest.mark.parametrize("command", sorted(ELSEWHERE))
def test_a_threaded_kernel_is_refused_wherever_it_is_simulated(
    run_cli: Any, here: Path, made_run: Path, command: str
) -> None:
    """plan, --what-if and step ran it too: --what-if said it "saves 293 KiB", the step's
    forward read 586 KiB where the same kernel in this thread holds 713 KiB."""
    from small_config import SMALL

    body = (
        "from memprobe.kernels import get_kernel\nKEPT = None\n"
        "UNCHUNKED = get_kernel('unchunked')\n"
        "def k(logits, targets, *, chunk_size=None):\n" + THREADED["a thread pool"]
    )
    kernel = user_module(here, "r16_threaded", body) + ":k"
    (here / "config.json").write_text(json.dumps(SMALL))
    snap = str(next((made_run / "snapshots").glob("*.pickle")))
    args = [a.format(k=kernel, snap=snap, config="config.json") for a in ELSEWHERE[command]]
    err = one_line(*run_cli(*args))
    assert "allocated where memprobe cannot see it (in another thread" in err, err
    assert "try --device cpu" not in err


VIEWS = {
    "a view of the logits": "    return logits[..., 0]\n",
    "a non-contiguous result": "    return UNCHUNKED(logits, targets).t().contiguous().t()\n",
    "a detached copy's view": "    return get_kernel('unchunked')(logits, targets)[:, :]\n",
    "made in this thread under a lock": (
        "    import threading\n"
        "    with threading.Lock():\n"
        "        return get_kernel('unchunked')(logits, targets)\n"
    ),
}


@pytest.mark.parametrize("what", sorted(VIEWS))
def test_a_result_the_tracker_saw_is_measured(run_cli: Any, here: Path, what: str) -> None:
    body = (
        "from memprobe.kernels import get_kernel\nUNCHUNKED = get_kernel('unchunked')\n"
        "def k(logits, targets, *, chunk_size=None):\n" + VIEWS[what]
    )
    kernel = user_module(here, "r16_seen", body) + ":k"
    code, _, err = run_cli("sweep", *SWEEP, "--kernel", kernel, "--out", "o")
    assert code == 0, err
    (row,) = _rows(here / "o")
    assert row["status"] == "ok" and row["peak_bytes"] > 0, row["note"]


# -- the pytest marker and a test body that allocates in a thread it starts: the tracker
# (and the meta default device) hold for the test's own thread only, so 8 MiB allocated
# in a thread passed a limit of 1 MiB, its peak read as 0 B

MARKED = """
import concurrent.futures, threading, pytest, torch
def body():
    torch.empty(1024, 1024, device='meta') * 2
@pytest.mark.limit_peak_memory('1 MiB')
def test_a_thread_on_meta():
    t = threading.Thread(target=body); t.start(); t.join()
@pytest.mark.limit_peak_memory('1 MiB', device='cpu')
def test_a_thread_on_cpu():
    t = threading.Thread(target=body); t.start(); t.join()
@pytest.mark.limit_peak_memory('1 MiB')
def test_a_thread_pool():
    concurrent.futures.ThreadPoolExecutor(1).submit(body).result()
@pytest.mark.limit_peak_memory('1 MiB')
def test_its_own_thread_under_the_limit():
    torch.empty(16, device='meta')
"""


def test_the_marker_fails_a_body_that_allocates_in_threads(pytester: pytest.Pytester) -> None:
    # One pytester run: a second one in this process re-imports torch's submodules.
    from importlib.metadata import entry_points

    import torch

    from memprobe.measure.tracker import AllocationTracker

    with AllocationTracker():  # torch's lazy imports, before pytester's run drops them
        torch.empty(2, 3, device="meta").float()
    installed = any(
        ep.value == "memprobe.commands.pytest_plugin" for ep in entry_points(group="pytest11")
    )
    pytester.makepyfile(test_marked=MARKED)
    args = () if installed else ("-p", "memprobe.commands.pytest_plugin")
    result = pytester.runpytest("--strict-markers", *args)
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(["*limit_peak_memory: the test body started 1 thread(s)*"] * 3)
