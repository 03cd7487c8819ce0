"""Hostile inputs, round 33 (user code memprobe runs: kernels swept and planned, a kernel
planned size by size in fresh processes since round 32): each row is a variant of a defect
class the pass found. The classes, in order: Ctrl-C (or a kernel's KeyboardInterrupt)
while plan simulates a size in a fresh process; what an earlier case kept, let go of in a
reference cycle; what a kernel keeps, swept on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile import user_module

# A kernel module keeping every call's logits (so plan simulates each size after its
# first in a fresh process) that runs ``{body}`` in such a process only.
KEEPING_FRESH = (
    "import os, signal, multiprocessing\nfrom memprobe.kernels import get_kernel\n"
    "_u = get_kernel('unchunked')\n_B = []\n"
    "def k(logits, targets, *, chunk_size=None):\n    _B.append(logits)\n"
    "    if multiprocessing.parent_process() is not None:\n        {body}\n"
    "    return _u(logits, targets)\n"
)
PLAN = ["plan", "--vocab", "128", "--budget", "1MiB", "--no-reserved"]


# -- Ctrl-C while plan simulated a size in a fresh process: multiprocessing printed the
# process's own traceback ("Process ForkServerProcess-1:", 20 lines, KeyboardInterrupt)
# under the plan's exit 130; a kernel raising KeyboardInterrupt there (treated as Ctrl-C
# in the planning process) read "ended the process that simulated it", exit 2, beneath it.
INTERRUPTS = {
    "KeyboardInterrupt raised": "raise KeyboardInterrupt",
    "a subclass raised": "raise type('Stop', (KeyboardInterrupt,), {})()",
    "SIGINT to that process alone": "os.kill(os.getpid(), signal.SIGINT)",
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("what", INTERRUPTS)
def test_ctrl_c_in_a_fresh_simulation_is_the_plans(run_cli: Any, here: Path, what: str) -> None:
    mod = user_module(here, "r33_int", KEEPING_FRESH.format(body=INTERRUPTS[what]))
    code, out, err = run_cli(*PLAN, "--kernel", f"{mod}:k")
    assert code == 130 and not out, (code, out, err)
    assert "Traceback" not in err and "Process" not in err, err


# ...and the fork server itself, importing torch for seconds before it ignores SIGINT on
# its own, printed a 40-line traceback of that import when Ctrl-C came meanwhile: it is
# started deaf to it.
@pytest.mark.multiprocess
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_the_fork_server_starts_deaf_to_ctrl_c() -> None:
    probe = (
        "import os, signal, multiprocessing.forkserver as f\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from memprobe.measure import fresh\nfresh._context()\nf.ensure_running()\n"
        "pid = f._forkserver._forkserver_pid\n"
        "ignored = [l for l in open(f'/proc/{pid}/status') if l.startswith('SigIgn')][0]\n"
        "os.kill(pid, signal.SIGKILL)\n"
        "print(int(ignored.split()[1], 16) >> (signal.SIGINT - 1) & 1)\n"
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip
    # The server ignores it; the planning process hears Ctrl-C again.
    assert done.stdout.split() == ["1", "True"], done.stderr


# -- what an earlier case kept that a later case let go of, in a reference cycle: the
# collection at each case's end scans only what the case made (round 32's young
# collection), so a cached state object replaced per call (``s.me = s; _S['s'] = s``) was
# never collected and was held once more at every later case: "this peak holds
# 3,145,728 B the kernel kept from earlier cases" at a sweep's fourth size, its peak
# 5,113,856 B where 1 MiB is reachable (3,016,704 B, as before round 32).
CYCLE = (
    "import torch\nfrom memprobe.kernels import get_kernel\n_u = get_kernel('unchunked')\n"
    "_S = {{}}\nclass State: pass\n"
    "def k(logits, targets, *, chunk_size=None):\n"
    "    buf = torch.empty(1 << 20, dtype=torch.uint8, device=logits.device)\n"
    "    {body}\n    return _u(logits, targets)\n"
)
CYCLES = {
    "an object referring to itself": "s = State(); s.me = s; s.buf = buf; _S['s'] = s",
    "a list holding itself": "s = [buf]; s.append(s); _S['s'] = s",
    "a closure calling itself": "def s(): return s, buf\n    _S['s'] = s",
}


def test_an_earlier_cases_garbage_cycle_is_not_held(run_cli: Any, here: Path) -> None:
    mods = [user_module(here, "r33_cycle", CYCLE.format(body=body)) for body in CYCLES.values()]
    code, out, err = run_cli("sweep", "--tokens", "64,128,256", "--vocab", "128", "--no-ladder",
                             "--device", "meta", "--no-verify", "--no-report", "--json",
                             "--kernel", ",".join(f"{m}:k" for m in mods))  # fmt: skip
    assert code == 0, err
    rows = {(r["kernel"], r["tokens"]): r for r in json.loads(out)["results"]}
    for mod in mods:
        for tokens in (128, 256):  # the one it holds, made by the case before
            note = rows[f"{mod}:k", tokens]["note"]
            assert "holds 1,048,576 B the kernel kept" in note, (mod, tokens, note)
        assert rows[f"{mod}:k", 256]["peak_bytes"] == 2_556_928  # 2 MiB + unchunked's 459,776


# -- a kernel that keeps memory, swept on the CPU: each case is first simulated on meta
# (to size it against the RAM) and then timed, both in the same process and both calling
# the kernel, untracked: what its last call kept (a tensor cached per call) was a meta
# tensor or one no tracker saw, and a later case held none of it. The note said the 1 MiB
# kept was "counted in this peak and in its later cases'"; the 128-token peak read
# 1,278,464 B (unchunked's plus this case's 1 MiB) where meta reads 2,129,920 B.
KEPT_ON_CPU = {
    "a tensor replaced per call": ("_S['s'] = buf", 2_129_920),
    "a state object referring to itself": (CYCLES["an object referring to itself"], 2_327_040),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("what", KEPT_ON_CPU)
def test_what_a_kernel_keeps_on_cpu_is_held_by_its_next_case(
    run_cli: Any, here: Path, what: str
) -> None:
    body, peak = KEPT_ON_CPU[what]
    mod = user_module(here, "r33_cpu_kept", CYCLE.format(body=body))
    code, out, err = run_cli("sweep", "--tokens", "64,128", "--vocab", "128", "--no-ladder",
                             "--device", "cpu", "--no-verify", "--no-report", "--json",
                             "--kernel", f"{mod}:k")  # fmt: skip
    assert code == 0, err
    rows = {r["tokens"]: r for r in json.loads(out)["results"]}
    assert "holds 1,048,576 B the kernel kept" in rows[128]["note"], rows[128]["note"]
    assert rows[128]["peak_bytes"] == peak  # as on meta
