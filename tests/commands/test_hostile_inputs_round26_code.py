"""Hostile inputs, round 26 (user code memprobe imports and runs: a user's kernel and its
backward, a user's step, the module each lives in, a test body under the pytest marker):
each row is a variant of a defect class the pass found. One line and exit 2, the case's
error row, or a sane answer, and memprobe's own work after the user code as it would be
without it. The classes, in order: torch's thread-local dispatch state a guard left
entered; the copy of standard output closed; faulthandler's timer; audit hooks; memprobe's
own modules changed; a kernel failing only in the numerics check; a result answering for
itself (a Tensor subclass); the garbage collector's settings; a marked body that forks;
os._exit in an atexit function; sys.path entries put first; torch's operators replaced;
where matplotlib keeps its files; a step told meta's hint for what it did to memprobe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hostile import TINY_STEP, one_line, user_module
from launch import forked_pytest, forked_torchrun

from memprobe.kernels.user_process import StreamsLost, stderr_fd_kept, stdout_fd_kept

pytest_plugins = ["pytester"]

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--device", "meta",
         "--no-verify", "--no-report", "--json"]  # fmt: skip
# A kernel module: ``{pre}`` at module level, then a kernel whose body is ``{body}``.
KERNEL = (
    "import sys, os, torch\nfrom memprobe.kernels import get_kernel\n"
    "_u = get_kernel('unchunked')\n_KEPT = []\n{pre}\n"
    "def k(logits, targets, *, chunk_size=None):\n    {body}\n"
)
RETURNS = "return _u(logits, targets)"
OWN = ["ok", 114944, "ok", 66304]  # unchunked's and local_chunked's rows at 64 x 128


def _kernel(here: Path, stem: str, pre: str = "", body: str = RETURNS) -> str:
    return user_module(here, stem, KERNEL.format(pre=pre, body=body)) + ":k"


def _rows(run_cli: Any, kernel: str, *more: str) -> list[dict[str, Any]]:
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked,local_chunked", *more)
    assert code == 0, err
    return json.loads(out)["results"]


def _own(rows: list[dict[str, Any]]) -> list[Any]:
    """memprobe's own two rows, after the user's: status and peak of each."""
    return [v for row in rows[1:] for v in (row["status"], row["peak_bytes"])]


# -- torch's thread-local dispatch state a guard user code entered and kept left for
# everything after it (torch._C._DisableTorchDispatch, inference_mode, the autograd keys
# excluded): kept on by a kernel's module as it was imported, every row of the sweep was an
# error, memprobe's own kernels' too ("allocated where memprobe cannot see it", "does not
# require grad", "Inference tensors cannot be saved"), and `profile` said the step "made
# no tensor on meta"; kept on by a kernel as it ran, the rows after it failed alike; kept
# on by a marked test body, what it allocated after was never seen, and it passed its limit.
ENTERED = {
    "torch dispatch off": "torch._C._DisableTorchDispatch()",
    "inference mode": "torch.inference_mode()",
    "autograd keys excluded": "torch._C._AutoDispatchBelowAutograd()",
    "all three": "torch._C._DisableTorchDispatch(), torch.inference_mode(), "
    "torch._C._AutoDispatchBelowAutograd()",
}
KEEP = "for _g in ({guards},): _g.__enter__(); _KEPT.append(_g)"


@pytest.mark.parametrize("what", ENTERED)
def test_a_guard_a_kernels_module_keeps_entered_is_put_back(
    run_cli: Any, here: Path, what: str
) -> None:
    pre = KEEP.format(guards=ENTERED[what])
    rows = _rows(run_cli, _kernel(here, "r26_keys_import", pre))
    assert _own(rows) == OWN  # the kernel's own row: as its module left gradients
    assert not torch.is_inference_mode_enabled()


@pytest.mark.parametrize("what", ENTERED)
def test_a_guard_a_kernel_keeps_entered_is_its_own(run_cli: Any, here: Path, what: str) -> None:
    body = KEEP.format(guards=ENTERED[what]) + "\n    " + RETURNS
    rows = _rows(run_cli, _kernel(here, "r26_keys_call", body=body))
    assert rows[0]["status"] == "error" and _own(rows) == OWN
    if "dispatch" in ENTERED[what]:
        assert "Python dispatch turned off" in rows[0]["note"]


def test_a_steps_module_keeping_torch_dispatch_off_is_profiled(run_cli: Any, here: Path) -> None:
    pre = "import torch\n_g = torch._C._DisableTorchDispatch()\n_g.__enter__()\n"
    step = user_module(here, "r26_keys_step", pre + TINY_STEP) + ":step"
    code, out, err = run_cli("profile", step, "--device", "meta", "--json")
    assert code == 0, err
    assert json.loads(out)["peak_allocated_bytes"] == 1032


@pytest.mark.multiprocess
def test_a_marked_body_keeping_torch_dispatch_off_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_blind=(
            "import pytest, torch\n"
            "@pytest.mark.limit_peak_memory('1 KiB')\n"
            "def test_blind():\n"
            "    g = torch._C._DisableTorchDispatch(); g.__enter__(); globals()['_g'] = g\n"
            "    torch.zeros(1 << 20)\n"
            "@pytest.mark.limit_peak_memory('1 KiB')\n"
            "def test_inference():\n"
            "    g = torch.inference_mode(); g.__enter__(); globals()['_h'] = g\n"
            "def test_next():\n"
            "    assert not torch.is_inference_mode_enabled()\n"
            "    x = torch.ones(2, requires_grad=True)\n"
            "    (x * 2).sum().backward()\n"
            "    assert x.grad is not None\n"
        )
    )
    result = forked_pytest(pytester, "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, passed=2)
    text = result.stdout.str()
    assert "Python dispatch turned off" in text and "Traceback" not in text


# -- the copy of standard output memprobe keeps while user code runs (its descriptor 1 then
# points at standard error) is a descriptor too: a kernel that ran os.closerange(3, 4096)
# closed it, and the sweep's --json answer went to standard error, exit 0, nothing on
# standard output; a descriptor the code then opened got its number, where memprobe would
# have written the answer.
def _lowest_free() -> int:
    fd = os.dup(0)
    os.close(fd)
    return fd


LOSSES = {
    "closed": "os.close(fd)",
    "closed and reused by a file": "os.close(fd); os.open(victim, os.O_WRONLY | os.O_CREAT)",
}


@pytest.mark.parametrize("what", LOSSES)
def test_a_closed_copy_of_standard_output_is_said_so(tmp_path: Path, what: str) -> None:
    victim = str(tmp_path / "victim")
    stdout = os.dup(1)
    try:
        fd = _lowest_free()  # the copy stdout_fd_kept makes first
        with pytest.raises(StreamsLost, match=f"descriptor {fd}"), stdout_fd_kept(None):
            exec(LOSSES[what], {"os": os, "fd": fd, "victim": victim})
    finally:
        os.dup2(stdout, 1)
        os.close(stdout)
    assert not os.path.exists(victim) or os.path.getsize(victim) == 0


def test_a_copy_left_alone_puts_standard_output_back() -> None:
    before = os.fstat(1)
    with stdout_fd_kept(None), stderr_fd_kept():
        assert os.path.sameopenfile(1, 2)
    assert os.fstat(1).st_ino == before.st_ino


def test_a_closed_copy_of_standard_error_is_no_traceback() -> None:
    stderr = os.dup(2)
    try:
        fd = _lowest_free()
        with stderr_fd_kept():
            os.close(fd)
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)


@pytest.mark.multiprocess
def test_a_kernel_closing_every_descriptor_is_one_line(here: Path) -> None:
    kernel = _kernel(here, "r26_closerange", body="os.closerange(3, 4096)\n    " + RETURNS)
    done = forked_torchrun([*SWEEP, "--kernel", f"{kernel},unchunked"], cwd=here, nproc=0)
    assert "closed memprobe's own file descriptor" in one_line(
        done.returncode, done.stdout, done.stderr
    )


# -- faulthandler's timer user code set and left running (faulthandler.dump_traceback_later,
# a watchdog it forgot to cancel) went off in memprobe's own work after the code: a thread
# dump on standard error ("Timeout (0:00:01)!"), and with exit=True the sweep ended mid-case,
# exit 1, in a 27-line traceback.
TIMERS = {
    "set by the module": ("faulthandler.dump_traceback_later(0.3, file=_F)", RETURNS),
    "set by the kernel": ("", "faulthandler.dump_traceback_later(0.3, file=_F)\n    " + RETURNS),
    "repeating": ("faulthandler.dump_traceback_later(0.3, repeat=True, file=_F)", RETURNS),
}


@pytest.mark.parametrize("what", TIMERS)
def test_a_faulthandler_timer_user_code_left_is_cancelled(
    run_cli: Any, here: Path, what: str
) -> None:
    pre, body = TIMERS[what]
    dump = here / "dump.txt"
    pre = f"import faulthandler\n_F = open({str(dump)!r}, 'w')\n{pre}"
    rows = _rows(run_cli, _kernel(here, "r26_faults", pre, body))
    time.sleep(0.35)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"] and not dump.read_text()


# -- an audit hook a kernel's module added (sys.addaudithook: it can never be taken off)
# ran in memprobe's own work after the code: one raising for every file opened for writing
# failed the sweep as "cannot write run/run.json: audit says no (choose another path)",
# blaming the path. Each sweep runs in a process of its own (forked from tests/launch.py's
# server): a hook added in a test worker stays for the rest of its tests, and every audited
# act there (an open, an import, a function's __code__ read) calls it, which made memprobe's
# guard around user code 9x slower for the worker's remaining tests.
AUDITS = {
    "open for writing": "ev == 'open' and MARK in str(a[0]) and a[2] & 3",
    "a rename (an atomic write)": "ev == 'os.rename' and MARK in str(a[1])",
    "a folder made": "ev == 'os.mkdir' and MARK in str(a[0])",
}
HOOK = (
    "MARK = {mark!r}\n"
    "def _hook(ev, a):\n"
    "    if ev == 'r26.user': sys.stderr.write('SEEN r26.user\\n')\n"
    "    if {when}: raise PermissionError('audit says no')\n"
    "sys.addaudithook(_hook)"
)


@pytest.mark.multiprocess
@pytest.mark.parametrize("what", AUDITS)
def test_an_audit_hook_sees_only_user_code(here: Path, what: str) -> None:
    pre = HOOK.format(mark="r26_audit", when=AUDITS[what])
    body = "sys.audit('r26.user')\n    " + RETURNS
    kernel = _kernel(here, "r26_audit", pre, body)
    argv = [*SWEEP, "--kernel", f"{kernel},unchunked,local_chunked", "--out", "r26_audit"]
    done = forked_torchrun(argv, cwd=here, nproc=0, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["results"]
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]
    assert done.stderr.count("SEEN r26.user") == 1  # once per call: one case


# -- memprobe's own modules, which a user's kernel imports and from there can change: a
# kernel's module that set registry.KERNELS["unchunked"] to local_chunked's spec had the
# sweep's unchunked row read 66,304 B, ok (it holds 114,944 B); one that emptied KERNELS
# ended the sweep as "unknown kernel 'unchunked'"; a property put on AllocationTracker, or
# another __code__ given to memprobe's kernel, failed every row. Done at import and in the
# kernel's own call alike.
OURS = (
    "import dataclasses, memprobe.kernels.registry as R, memprobe.measure.tracker as T\n"
    "import memprobe.kernels.autograd_reference as A\n"
)
CHANGES = {
    "a registry entry replaced": "R.KERNELS['unchunked'] = R.KERNELS['local_chunked']",
    "the registry emptied": "R.KERNELS.clear()",
    "a frozen spec's function replaced": "object.__setattr__(R.KERNELS['unchunked'], 'fn', "
    "R.KERNELS['local_chunked'].fn)",
    "a function's code replaced": "A.unchunked_logprobs.__code__ = (lambda *a, **k: 1).__code__",
    "a class's method replaced": "T.AllocationTracker.__torch_dispatch__ = None",
    "a property added to a class": "T.AllocationTracker.peak_bytes = property(lambda s: 1)",
    "a module's function rebound": "R.get_spec = lambda name: R.KERNELS['local_chunked']",
}


# Changed at once, in two groups (emptying the registry would hide a replaced entry): each
# kind of holder (a dict, a frozen object, a function, a class, a module) is put back by
# its own branch of one guard, and every change of a group must be undone.
CHANGE_GROUPS = [
    (
        "a registry entry replaced", "a frozen spec's function replaced",
        "a function's code replaced", "a property added to a class",
    ),
    ("the registry emptied", "a class's method replaced", "a module's function rebound"),
]  # fmt: skip


@pytest.mark.parametrize("where", ["module", "kernel"])
@pytest.mark.parametrize("group", CHANGE_GROUPS, ids=["group 1", "group 2"])
def test_what_user_code_changes_of_memprobe_is_put_back(
    run_cli: Any, here: Path, group: tuple[str, ...], where: str
) -> None:
    assert sorted(sum(CHANGE_GROUPS, ())) == sorted(CHANGES)
    changes = "\n".join(CHANGES[what] for what in group)
    pre = OURS + changes if where == "module" else OURS
    body = RETURNS if where == "module" else changes.replace("\n", "\n    ") + "\n    " + RETURNS
    rows = _rows(run_cli, _kernel(here, "r26_ours", pre, body))
    assert _own(rows) == OWN
    if where == "kernel":  # what it measured while memprobe was changed is not memprobe's
        assert rows[0]["status"] == "error"  # (or the change failed the call itself)
        # (a class's dispatch replaced fails the call itself first)
        assert "changed memprobe's own" in rows[0]["note"] or "a class's method replaced" in group


@pytest.mark.multiprocess
def test_a_marked_body_changing_memprobe_fails_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_ours=(
            "import pytest, torch\n"
            "import memprobe.measure.tracker as T\n"
            "@pytest.mark.limit_peak_memory('1 KiB')\n"
            "def test_blinds():\n"
            "    T.AllocationTracker.__torch_dispatch__ = (\n"
            "        lambda self, f, types, args=(), kwargs=None: f(*args, **(kwargs or {})))\n"
            "    torch.zeros(1 << 20)\n"
            "@pytest.mark.limit_peak_memory('8 MiB')\n"
            "def test_next():\n"
            "    torch.zeros(1 << 20)\n"
        )
    )
    result = forked_pytest(pytester, "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, passed=1)
    assert "changed memprobe's own memprobe.measure.tracker" in result.stdout.str()


def test_a_sweep_setting_memprobes_own_filters_is_put_back(run_cli: Any, here: Path) -> None:
    pre = "import memprobe.measure.step as St\nSt.SWEEP_FILTERS['filtered']['top_k'] = 1"
    code, out, err = run_cli(*SWEEP, "--kernel", f"{_kernel(here, 'r26_filters', pre)},filtered")
    assert code == 0, err
    assert json.loads(out)["results"][1]["note"] == "top_k=50, top_p=0.9"


# -- a kernel that failed only in the numerics check (run again on CPU at its own shape,
# 2 x 67 x 263, chunk 7, after the case measured) ended the whole sweep in its traceback,
# exit 1, no results printed: a kernel whose chunk must divide the tokens is such a one.
CPU_SWEEP = ["sweep", "--tokens", "16", "--vocab", "32", "--no-ladder", "--device", "cpu",
             "--no-report", "--json"]  # fmt: skip
AT_CHECK = "if logits.shape[1] == 67:\n        "
ONLY_IN_CHECK = {
    "a chunk that must divide the tokens": "assert logits.shape[1] % 8 == 0, 'tokens % 8'",
    "an exit": "sys.exit(3)",
    "a result of another shape": "return _u(logits, targets)[:, :1]",
    "a detached result": "return _u(logits, targets).detach()",
    "a memory error": "raise MemoryError('no room at the check')",
}


@pytest.mark.parametrize("what", ONLY_IN_CHECK)
def test_a_kernel_failing_only_in_the_numerics_check_is_its_row(
    run_cli: Any, here: Path, what: str
) -> None:
    kernel = _kernel(here, "r26_check", body=AT_CHECK + ONLY_IN_CHECK[what] + "\n    " + RETURNS)
    code, out, err = run_cli(*CPU_SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    mine, own = json.loads(out)["results"]
    assert mine["status"] == "error" and mine["peak_bytes"] == own["peak_bytes"]
    assert mine["note"].startswith("numerics check failed: the kernel failed at the CPU check")
    assert own["status"] == "ok" and own["max_abs_err_fwd"] is not None


# -- a result (or a gradient) of a torch.Tensor subclass with its own __torch_function__ or
# __torch_dispatch__: memprobe reads its shape, and its values against float64, through
# that code. A kernel returning zeros as such a subclass, .item() answering 0.0, had its row
# read ok with max |error| 0.0 forward and backward; one whose backward gave its gradient
# so read 0.0 backward.
SUBCLASS = (
    "class Liar(torch.Tensor):\n"
    "    @classmethod\n"
    "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
    "        out = super().__torch_function__(func, types, args, kwargs or {})\n"
    "        return 0.0 if getattr(func, '__name__', '') == 'item' else out\n"
    "class Quiet(torch.Tensor):\n"
    "    __torch_dispatch__ = torch._C._disabled_torch_dispatch_impl\n"
    "class Child(Liar):\n    pass\n"
    "class Plain(torch.Tensor):\n    pass\n"
    "class F(torch.autograd.Function):\n"
    "    @staticmethod\n"
    "    def forward(ctx, logits, targets):\n"
    "        ctx.save_for_backward(logits)\n"
    "        return _u(logits.detach(), targets).detach()\n"
    "    @staticmethod\n"
    "    def backward(ctx, g):\n"
    "        return torch.zeros_like(ctx.saved_tensors[0]).as_subclass(Liar), None\n"
)
RESULTS = {
    "a lying result": ("return (_u(logits, targets) * 0).as_subclass(Liar)", "kernel returned"),
    "a dispatching result": ("return _u(logits, targets).as_subclass(Quiet)", "kernel returned"),
    "a lying subclass's subclass": ("return _u(logits, targets).as_subclass(Child)", "returned"),
    "a lying gradient": ("return F.apply(logits, targets)", "gave its gradient as a Liar"),
}


@pytest.mark.parametrize("what", RESULTS)
def test_a_subclass_answering_for_a_result_is_refused(run_cli: Any, here: Path, what: str) -> None:
    body, said = RESULTS[what]
    code, out, err = run_cli(*CPU_SWEEP, "--kernel", _kernel(here, "r26_liar", SUBCLASS, body))
    assert code == 0, err
    (row,) = json.loads(out)["results"]
    assert row["status"] == "error" and said in row["note"] and row["max_abs_err_fwd"] is None


def test_a_plain_subclass_result_is_still_measured(run_cli: Any, here: Path) -> None:
    body = "return _u(logits, targets).as_subclass(Plain)"
    code, out, err = run_cli(*CPU_SWEEP, "--kernel", _kernel(here, "r26_plain", SUBCLASS, body))
    assert code == 0, err
    (row,) = json.loads(out)["results"]
    assert row["status"] == "ok" and 0 < row["max_abs_err_fwd"] < 1e-5


# -- the garbage collector's settings user code changed: a kernel's module that set
# gc.set_debug(gc.DEBUG_STATS) had every collection after it print its statistics on
# standard error (a bad --kernel name's one line came with 30 more); gc.DEBUG_LEAK printed
# 150,000 lines in a two-case sweep and kept every object collected in gc.garbage.
GC = {
    "statistics printed": "gc.set_debug(gc.DEBUG_STATS)",
    "everything leaked": "gc.set_debug(gc.DEBUG_LEAK)",
    "collection off": "gc.disable()",
    "a collection at every allocation": "gc.set_threshold(1, 1, 1)",
}


@pytest.mark.parametrize("what", GC)
def test_the_collectors_settings_user_code_changes_are_put_back(
    run_cli: Any, here: Path, what: str
) -> None:
    import gc

    before = gc.get_debug(), gc.isenabled(), gc.get_threshold()
    kernel = _kernel(here, "r26_gc", "import gc\n" + GC[what])
    line = one_line(*run_cli(*SWEEP, "--kernel", f"{kernel},unchunked", "--chunk-size", "0"))
    assert "chunk" in line
    assert (gc.get_debug(), gc.isenabled(), gc.get_threshold()) == before and not gc.garbage
    rows = _rows(run_cli, kernel)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]


# -- a marked test body that forked (os.fork()): the child ran the rest of the session too,
# every later test twice, as a forking kernel's child once ran the rest of a sweep.
@pytest.mark.multiprocess
@pytest.mark.parametrize("body", ["os.fork()", "os.fork()\n    raise ValueError('both')"])
def test_a_marked_body_that_forks_runs_the_session_once(
    pytester: pytest.Pytester, body: str
) -> None:
    pytester.makepyfile(
        test_fork=(
            "import os, pytest, torch\n"
            "@pytest.mark.limit_peak_memory('1 MiB')\n"
            f"def test_forks():\n    {body}\n"
            "def test_after():\n    print('AFTER', os.getpid())\n"
        )
    )
    result = forked_pytest(pytester, "-p", "no:cacheprovider", "-s")
    assert result.stdout.str().count("AFTER") == 1


# -- os._exit in a function user code registered with atexit (registered itself, or called
# by one) ended memprobe's process there with the code's status: a sweep's exit 0 read 7,
# and a failed gate's 1 could read 0.
def _bye_direct() -> Any:
    return os._exit, (7,)


def _bye_called() -> Any:
    return (lambda: os._exit(9)), ()


@pytest.mark.parametrize("registered", [_bye_direct, _bye_called])
def test_an_exit_registered_with_atexit_is_not_memprobes_status(
    registered: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from memprobe.kernels import user_guards

    fn, args = registered()
    before = os._exit  # memprobe's (round 27: a thread user code started exits alone)
    user_guards._register_shielded(fn, *args)
    try:
        for shielded in user_guards._SHIELDED[id(fn)]:
            shielded()  # as the process ends: it returns, the process goes on
    finally:
        user_guards._unregister_shielded(fn)
    assert "not run: memprobe's exit status is its own" in capsys.readouterr().err
    assert os._exit is before


@pytest.mark.multiprocess
def test_a_sweep_whose_kernel_registered_an_exit_exits_0(here: Path) -> None:
    kernel = _kernel(here, "r26_bye", "import atexit\natexit.register(os._exit, 7)")
    # A process started afresh: one forked from the preloaded server never runs atexit's.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), *sys.path]))
    done = subprocess.run(
        [sys.executable, "-m", "memprobe", *SWEEP, "--kernel", kernel],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and json.loads(done.stdout)["results"][0]["status"] == "ok"
    assert "os._exit(7), not run" in done.stderr


# -- sys.path entries user code added before memprobe's own: a module there named like one
# memprobe imports later (a matplotlib.py raising ImportError) was imported in its place,
# and the sweep's report ended in its traceback, exit 1. They stay, after memprobe's own:
# the code still imports its own modules from them.
ADDED = {
    "inserted first": "sys.path.insert(0, SHADOW)",
    "several put first": "sys.path[:0] = [SHADOW, SHADOW + '_too']",
    "the whole list replaced": "sys.path = [SHADOW, *sys.path]",
}


@pytest.mark.parametrize("where", ["module", "kernel"])
@pytest.mark.parametrize("what", ADDED)
def test_path_entries_user_code_adds_come_after_memprobes(
    run_cli: Any, here: Path, what: str, where: str
) -> None:
    shadow = here / "shadow"
    shadow.mkdir()
    (shadow / "r26_sibling.py").write_text("VALUE = 1\n")
    pre = f"SHADOW = {str(shadow)!r}\n" + (ADDED[what] if where == "module" else "")
    body = (ADDED[what] + "\n    " if where == "kernel" else "") + (
        "import r26_sibling\n    " + RETURNS
    )
    rows = _rows(run_cli, _kernel(here, "r26_path", pre, body))
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]  # its sibling imported late
    first_added = sys.path.index(str(shadow))
    assert all(sys.path.index(e) < first_added for e in sys.path if "shadow" not in e)


# -- an implementation of one of torch's operators a kernel's module registered
# (torch.library): it replaced torch's for every kernel in the process, memprobe's own too,
# whose unchunked row failed in it ("Index tensor must have the same number of dimensions").
SMALL_META = "lambda x, d, h: torch.empty((1,), dtype=x.dtype, device=x.device)"
OPS = {
    "a Library's impl": "_L = torch.library.Library('aten', 'IMPL')\n"
    f"_L.impl('_log_softmax', {SMALL_META}, 'Meta')",
    "torch.library.impl": f"torch.library.impl('aten::_log_softmax', 'Meta')({SMALL_META})",
}


@pytest.mark.parametrize("what", OPS)
def test_a_module_replacing_torchs_operator_is_refused(run_cli: Any, here: Path, what: str) -> None:
    kernel = _kernel(here, "r26_ops", OPS[what])
    line = one_line(*run_cli(*SWEEP, "--kernel", f"{kernel},unchunked"))
    assert "registered its own aten::_log_softmax for Meta" in line
    rows = _rows(run_cli, _kernel(here, "r26_ops_after"))  # taken off again
    assert _own(rows) == OWN


def test_a_kernel_replacing_torchs_operator_is_its_row(run_cli: Any, here: Path) -> None:
    same = "lambda x, d, h: torch.empty_like(x, dtype=torch.float32 if h else x.dtype)"
    body = OPS["a Library's impl"].replace(SMALL_META, same).replace("\n", "\n    ")
    body += "\n    " + RETURNS
    rows = _rows(run_cli, _kernel(here, "r26_ops_call", "", body))
    assert rows[0]["status"] == "error" and "registered its own aten::" in rows[0]["note"]
    assert _own(rows) == OWN


def test_an_operator_of_the_codes_own_is_its_own(run_cli: Any, here: Path) -> None:
    pre = (
        "_L = torch.library.Library('r26own', 'DEF')\n_L.define('twice(Tensor x) -> Tensor')\n"
        "_L.impl('twice', lambda x: x * 2, 'CompositeExplicitAutograd')"
    )
    rows = _rows(run_cli, _kernel(here, "r26_ops_own", pre))
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]


# -- (round 13's class, more variables) where matplotlib keeps its config and cache, set by
# a kernel's module to a path that cannot be one: the report's first matplotlib import
# printed "mkdir -p failed" and "Matplotlib created a temporary cache directory" on stderr.
@pytest.mark.parametrize("name", ["MPLCONFIGDIR", "HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"])
def test_where_matplotlib_keeps_its_files_is_the_users(run_cli: Any, here: Path, name: str) -> None:
    before = os.environ.get(name)
    pre = f"os.environ[{name!r}] = '/dev/null/r26'"
    rows = _rows(run_cli, _kernel(here, "r26_mpl", pre))
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]
    assert os.environ.get(name) == before


# -- a step that changed memprobe's own modules or replaced one of torch's operators was
# told of meta's limits ("meta tensors hold no values ... try --device cpu").
STEP_CHANGES = {
    "memprobe's registry emptied": "import memprobe.kernels.registry as R\nR.KERNELS.clear()",
    "torch's operator replaced": "L = torch.library.Library('aten', 'IMPL')\n"
    "L.impl('_log_softmax', lambda x, d, h: torch.empty_like(x), 'Meta')\n_KEEP = [L]",
}


@pytest.mark.parametrize("what", STEP_CHANGES)
def test_a_step_changing_memprobe_or_torch_is_told_what_it_did(
    run_cli: Any, here: Path, what: str
) -> None:
    body = "import torch\ndef step(device):\n    " + STEP_CHANGES[what].replace("\n", "\n    ")
    body += "\n    w = torch.zeros(8, 8, device=device, requires_grad=True)\n"
    body += "    (w @ w).sum().backward()\n"
    step = user_module(here, "r26_step_changes", body) + ":step"
    line = one_line(*run_cli("profile", step, "--device", "meta"))
    assert line.startswith("memprobe: error: the step failed: the code ")
    assert "meta tensors" not in line


# -- what user code left to run later printed into --json's object: a finalizer on the
# logits (weakref.finalize(logits, print, ...)) or an object with a printing __del__
# attached to them ran in memprobe's own work after the call, where standard output was
# the answer's again ("FINALIZED logits" ahead of the JSON). With --json, standard output
# holds the object alone for the whole command; the rest goes to standard error.
LATER = {
    "finalizer": "weakref.finalize(logits, print, 'LATER: finalized'); return _u(logits, targets)",
    "__del__": "logits._later = _Later(); return _u(logits, targets)",
}
LATER_PRE = "import weakref\nclass _Later:\n    def __del__(self): print('LATER: del')\n"


@pytest.mark.parametrize("what", LATER)
def test_what_user_code_prints_later_is_not_in_the_json(
    run_cli: Any, here: Path, what: str
) -> None:
    kernel = _kernel(here, "r26_later", LATER_PRE, LATER[what])
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0 and "LATER" in err, err
    assert [r["status"] for r in json.loads(out)["results"]] == ["ok", "ok"]


def test_a_steps_later_print_is_not_in_profiles_json(run_cli: Any, here: Path) -> None:
    body = TINY_STEP + "    import weakref; weakref.finalize(w, print, 'LATER'); return w\n"
    step = user_module(here, "r26_later_step", body) + ":step"
    code, out, err = run_cli("profile", step, "--device", "meta", "--json")
    assert code == 0 and "LATER" in err, err
    assert json.loads(out)["peak_allocated_bytes"] == 1032


# -- a kernel's error row beside ok rows: pandas held each byte column as floats (the error
# row's cell is empty), and results.csv and --json printed the other rows' bytes as
# "114944.0". results.json wrote them whole; now all three do.
def test_byte_counts_stay_whole_beside_an_error_row(run_cli: Any, here: Path) -> None:
    kernel = _kernel(here, "r26_whole", body="raise ValueError('no')")
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked", "--out", "run")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert rows[1]["peak_bytes"] == 114944 and isinstance(rows[1]["peak_bytes"], int)
    csv = (here / "run" / "results.csv").read_text().splitlines()
    assert ",ok,114944,81920,114944," in csv[2] and ".0," not in csv[2]


# -- a thread user code started that keeps replacing sys.stdout (round 27, C12): the
# answer was written to whatever sys.stdout was by then, and --json printed nothing, exit
# 0. The object goes to the standard output the command started with. In a process of its
# own: the thread never ends.
@pytest.mark.multiprocess
def test_a_thread_replacing_stdout_does_not_take_the_json(here: Path) -> None:
    swaps = (
        "import io, threading, time\n"
        "def _swap():\n    while True:\n        sys.stdout = io.StringIO(); time.sleep(0.01)\n"
    )
    body = "threading.Thread(target=_swap, daemon=True).start(); " + RETURNS
    kernel = _kernel(here, "r26_swaps", swaps, body)
    done = forked_torchrun([*SWEEP, "--kernel", f"{kernel},unchunked"], cwd=here, nproc=0)
    assert done.returncode == 0, done.stderr
    assert [r["status"] for r in json.loads(done.stdout)["results"]] == ["ok", "ok"]
