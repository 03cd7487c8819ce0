"""Hostile inputs, round 23 (user code memprobe imports and runs: a user's kernel, a
user's step, the pytest marker): each row is a variant of a defect class the pass found.
One line and exit 2, the case's error row, or a sane answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, user_module

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--device", "meta",
         "--no-verify", "--no-report", "--json"]  # fmt: skip
PLAN = ["plan", "--vocab", "128", "--budget", "1MiB", "--no-reserved"]

# A loss module named as the kernel: an instance of ``M``, whose forward is ``{forward}``.
MODULE = (
    "import torch\nfrom memprobe.kernels import get_kernel\n_u = get_kernel('unchunked')\n"
    "class M(torch.nn.Module):\n"
    "    def forward{forward}:\n"
    "        {body}\n"
    "k = M()\n"
)

# -- a torch.nn.Module instance named as the kernel was read by its ``__call__``, which
# takes ``*args, **kwargs``: refused as "takes *args, so its protocol is ambiguous" whatever
# its forward took, and told to set memprobe_inputs; one that did, with a forward lacking
# chunk_size (or needing a keyword, or a generator), then failed in every case. Its forward's
# signature is what a call runs, and is read as a function's is.

MODULES_READ = {
    "a logits forward": "(self, logits, targets, *, chunk_size=None)",
    "a forward taking **kwargs": "(self, logits, targets, **kwargs)",
    "chunk_size positional-or-keyword": "(self, logits, targets, chunk_size=None)",
}


@pytest.mark.parametrize("what", MODULES_READ)
def test_a_loss_module_is_read_by_its_forward(run_cli: Any, here: Path, what: str) -> None:
    body = MODULE.format(forward=MODULES_READ[what], body="return _u(logits, targets)")
    kernel = user_module(here, "r23_module", body) + ":k"
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["ok", "ok"], rows[0]["note"]
    assert rows[0]["peak_bytes"] == rows[1]["peak_bytes"]


MODULES_REFUSED = {
    "no chunk_size": ("(self, logits, targets)", "return 0", "takes no chunk_size keyword"),
    "a keyword memprobe never passes": (
        "(self, logits, targets, *, chunk_size=None, scale)",
        "return 0",
        "requires keyword 'scale'",
    ),
    "a generator forward": (
        "(self, logits, targets, *, chunk_size=None)",
        "yield 0",
        "is a generator function",
    ),
    "a hidden forward without --hidden": (
        "(self, hidden, weight, targets, *, chunk_size=None)",
        "return 0",
        "takes hidden states and the lm_head weight",
    ),
    "one positional parameter": (
        "(self, logits, *, chunk_size=None)",
        "return 0",
        "takes 1 positional argument (logits)",
    ),
}


@pytest.mark.parametrize("what", MODULES_REFUSED)
def test_a_loss_module_with_a_wrong_forward_is_one_line(
    run_cli: Any, here: Path, what: str
) -> None:
    forward, body, said = MODULES_REFUSED[what]
    kernel = user_module(here, "r23_badmodule", MODULE.format(forward=forward, body=body)) + ":k"
    for command in (SWEEP, PLAN):
        line = one_line(*run_cli(*command, "--kernel", kernel))
        assert said in line and "*args" not in line, line


# ...and a module named as the step (``forward(self, device)``) is read the same way: one
# whose forward took no device, or was a generator, was taken, then failed (or ran none of
# its body).
STEP_MODULE = (
    "import torch\nclass M(torch.nn.Module):\n    def forward{forward}:\n{body}step = M()\n"
)
ALLOCATES = "        (torch.zeros(8, 8, device=device, requires_grad=True) * 2).sum().backward()\n"
STEP_MODULES = {
    "a forward taking no device": ("(self)", "        pass\n", "does not take one argument"),
    "a generator forward": ("(self, device)", "        yield\n", "is a generator"),
    "a forward taking two": ("(self, device, batch)", ALLOCATES, "does not take one argument"),
}


@pytest.mark.parametrize("what", STEP_MODULES)
def test_a_step_module_is_read_by_its_forward(run_cli: Any, here: Path, what: str) -> None:
    forward, body, said = STEP_MODULES[what]
    step = user_module(here, "r23_stepmod", STEP_MODULE.format(forward=forward, body=body))
    line = one_line(*run_cli("profile", f"{step}:step", "--out", "s.pickle"))
    assert said in line and not (here / "s.pickle").exists()


def test_a_step_module_with_a_device_forward_runs(run_cli: Any, here: Path) -> None:
    body = STEP_MODULE.format(forward="(self, device)", body=ALLOCATES)
    step = user_module(here, "r23_stepmod", body)
    code, out, err = run_cli("profile", f"{step}:step", "--out", "s.pickle", "--json")
    assert code == 0, err
    assert (here / "s.pickle").exists()


# -- what user code raised is read by memprobe outside its guards: an exception whose
# ``__str__`` raised a BaseException that is not an Exception (sys.exit(7) in it) ended
# memprobe with that status and nothing printed, as the kernel's or step's one line was
# written; a step or kernel that called ``sys.exit(obj)`` with an object whose ``__repr__``
# raised ended in a traceback. The message is said to be unreadable, and the line stands.

MESSAGE_EXITS = {
    "sys.exit(7)": "raise SystemExit(7)",
    "GeneratorExit": "raise GeneratorExit",
    "a BaseException of its own": "raise type('Halt', (BaseException,), {})()",
}
RAISES = "class E(Exception):\n    def __str__(self):\n        {exits}\n"


@pytest.mark.parametrize("what", MESSAGE_EXITS)
def test_an_exception_whose_message_exits_is_still_one_line(
    run_cli: Any, here: Path, what: str
) -> None:
    pre = RAISES.format(exits=MESSAGE_EXITS[what])
    body = "import torch\n" + pre + "def k(logits, targets, *, chunk_size=None):\n    raise E()\n"
    kernel = user_module(here, "r23_msgexit", body) + ":k"
    code, out, _ = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert "could not be read" in rows[0]["note"]
    assert "could not be read" in one_line(*run_cli(*PLAN, "--kernel", kernel))
    step = user_module(
        here, "r23_msgstep", "import torch\n" + pre + "def step(device):\n    raise E()\n"
    )
    assert "could not be read" in one_line(*run_cli("profile", f"{step}:step", "--out", "s.pickle"))


BAD_REPR = "class W:\n    def __repr__(self):\n        {raises}\n"
REPRS = {
    "an Exception": "raise RuntimeError('no repr')",
    "sys.exit()": "raise SystemExit(9)",
}


@pytest.mark.parametrize("what", REPRS)
def test_an_exit_with_an_unprintable_code_is_one_line(run_cli: Any, here: Path, what: str) -> None:
    pre = "import sys, torch\n" + BAD_REPR.format(raises=REPRS[what])
    step = user_module(here, "r23_exitcode", pre + "def step(device):\n    sys.exit(W())\n")
    line = one_line(*run_cli("profile", f"{step}:step", "--out", "s.pickle"))
    assert "sys.exit((a W whose repr raised))" in line
    body = pre + "def k(logits, targets, *, chunk_size=None):\n    sys.exit(W())\n"
    kernel = user_module(here, "r23_exitk", body) + ":k"
    line = one_line(*run_cli(*PLAN, "--kernel", kernel))
    assert "sys.exit((a W whose repr raised))" in line


# -- a step that called memprobe's own trace_step or profile_step with the torch.device it
# was given was refused: "trace_step runs on meta or cpu, not device(type='meta')". A device
# is read by its name, as the pytest marker reads one.


def _allocates(device: Any) -> None:
    import torch

    torch.zeros(1 << 10, device=device)


@pytest.mark.parametrize("name", ["meta", "cpu"])
def test_the_profile_api_takes_a_torch_device(name: str) -> None:
    import torch

    from memprobe.profile import profile_step, trace_step

    assert trace_step(_allocates, torch.device(name)).peak_bytes == 4 << 10
    assert profile_step(_allocates, torch.device(name))["segments"]


def test_the_profile_api_still_refuses_a_device_it_cannot_trace() -> None:
    import torch

    from memprobe.errors import UserError
    from memprobe.profile import trace_step

    with pytest.raises(UserError, match="not 'cuda:1'"):
        trace_step(_allocates, torch.device("cuda", 1))


def test_a_step_tracing_an_inner_step_on_its_device_is_profiled(run_cli: Any, here: Path) -> None:
    body = (
        "import torch\nfrom memprobe.profile import trace_step\n"
        "def inner(device):\n    torch.zeros(8, device=device)\n"
        "def step(device):\n    trace_step(inner, device)\n    torch.zeros(64, device=device)\n"
    )
    step = user_module(here, "r23_nested", body) + ":step"
    code, _, err = run_cli("profile", step, "--out", "s.pickle")
    assert code == 0, err


# -- a module that replaced itself in sys.modules (``sys.modules[__name__] = None``, or an
# object of its own) without the function named: the import gives the replacement, and the
# one line said "'mine' is a module built into Python, so ./mine.py is not what that name
# imports (rename yours)" (an object without a __dict__ would have failed in listing its
# names). The line says what the import gave; a replacement that has the name is used.
REPLACED = {
    "None": "None",
    "an int": "5",
    "an object without the name": "type('O', (), {})()",
}


@pytest.mark.parametrize("what", REPLACED)
def test_a_module_replacing_itself_is_not_called_built_in(
    run_cli: Any, here: Path, what: str
) -> None:
    body = f"import sys\nsys.modules[__name__] = {REPLACED[what]}\n"
    # A module of its own per command: in this one process, the first import's None stays.
    kernel = user_module(here, "r23_replaced", body) + ":k"
    step = user_module(here, "r23_replaced_step", body) + ":step"
    for command in ([*PLAN, "--kernel", kernel], ["profile", step, "--out", "s.pickle"]):
        line = one_line(*run_cli(*command))
        assert "replaced itself in sys.modules" in line and "built into" not in line, line


def test_a_module_replacing_itself_with_the_kernel_on_it_runs(run_cli: Any, here: Path) -> None:
    body = (
        "import sys\nfrom memprobe.kernels import get_kernel\n"
        "class O:\n    k = staticmethod(get_kernel('unchunked'))\n"
        "sys.modules[__name__] = O()\n"
    )
    kernel = user_module(here, "r23_replacedk", body) + ":k"
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    assert [r["status"] for r in json.loads(out)["results"]] == ["ok", "ok"]


# -- a kernel that allocated on a thread it started got an "ok" row whose peak silently
# left those bytes out (the tracker sees the thread it runs on; a step already said so):
# the row says how many threads the kernel started and that their memory is not counted.
THREADED = (
    "import threading, torch\nfrom memprobe.kernels import get_kernel\n"
    "_u = get_kernel('unchunked')\nkept = []\n"
    "def k(logits, targets, *, chunk_size=None):\n"
    "    {start}\n"
    "    return _u(logits, targets)\n"
)
THREAD_STARTS = {
    "one thread allocating": (
        "t = threading.Thread(target=lambda: kept.append(torch.empty(1 << 20, "
        "device=logits.device))); t.start(); t.join()",
        1,
    ),
    "two threads doing nothing": (
        "ts = [threading.Thread(target=lambda: None) for _ in range(2)]; "
        "[t.start() for t in ts]; [t.join() for t in ts]",
        2,
    ),
    "no thread": ("pass", 0),
}


@pytest.mark.parametrize("what", THREAD_STARTS)
def test_a_kernels_threads_are_named_in_its_row(run_cli: Any, here: Path, what: str) -> None:
    start, threads = THREAD_STARTS[what]
    kernel = user_module(here, "r23_threads", THREADED.format(start=start)) + ":k"
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    mine, reference = json.loads(out)["results"]
    assert mine["status"] == "ok" and mine["peak_bytes"] == reference["peak_bytes"]
    said = f"the kernel started {threads:,} thread(s): memory allocated on them is not"
    assert (said in (mine["note"] or "")) == bool(threads), mine["note"]
    assert "thread" not in (reference["note"] or "")
