"""Hostile inputs, round 19 (flags, the process environment, user code): each row is a
variant of a defect class the pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_STEP, one_line, user_module
from small_config import SMALL

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--device", "meta",
         "--no-verify", "--no-report", "--json"]  # fmt: skip
LOGITS = "from memprobe.kernels import get_kernel\n_u = get_kernel('unchunked')\n"

# -- a kernel whose call can never give the log-probs: a class (an autograd.Function given
# by its class, not its apply), a generator or async function (an instance's async
# __call__ too), a keyword-only parameter without a default that memprobe never passes.
# The signature check took each; every case of a sweep was an error row of its own (exit
# 0), a step's line blamed "the model built from config.json", and an async kernel left
# Python's "coroutine ... was never awaited" warning on stderr, pointing into memprobe.

NEVER_A_TENSOR = {
    "a class": (
        "class k:\n    def __init__(self, logits, targets, *, chunk_size=None):\n"
        "        self.r = _u(logits, targets)\n",
        "is a class",
    ),
    "an autograd.Function": (
        "import torch\nclass k(torch.autograd.Function):\n    @staticmethod\n"
        "    def forward(ctx, logits, targets, chunk_size=None):\n"
        "        return _u(logits.detach(), targets)\n",
        "is a class",
    ),
    "a generator": (
        "def k(logits, targets, *, chunk_size=None):\n    yield _u(logits, targets)\n",
        "is a generator function",
    ),
    "a partial of a generator": (
        "import functools\ndef g(logits, targets, *, chunk_size=None):\n"
        "    yield _u(logits, targets)\nk = functools.partial(g)\n",
        "is a generator function",
    ),
    "async": (
        "async def k(logits, targets, *, chunk_size=None):\n    return _u(logits, targets)\n",
        "is an async function",
    ),
    "an async __call__": (
        "class K:\n    async def __call__(self, logits, targets, *, chunk_size=None):\n"
        "        return _u(logits, targets)\nk = K()\n",
        "is an async function",
    ),
    "an async generator": (
        "async def k(logits, targets, *, chunk_size=None):\n    yield 1\n",
        "is an async generator function",
    ),
    "a keyword it needs": (
        "def k(logits, targets, *, chunk_size=None, mode):\n    return _u(logits, targets)\n",
        "requires keyword 'mode'",
    ),
}


@pytest.mark.parametrize("what", NEVER_A_TENSOR)
@pytest.mark.parametrize("command", ["sweep", "plan", "step"])
def test_a_kernel_that_never_returns_a_tensor_is_refused_before_it_runs(
    run_cli: Any,
    here: Path,
    capsys: pytest.CaptureFixture[str],
    what: str,
    command: str,
) -> None:
    body, said = NEVER_A_TENSOR[what]
    kernel = user_module(here, "r19_never", LOGITS + body) + ":k"
    (here / "config.json").write_text(json.dumps(SMALL))
    argv = {
        "sweep": [*SWEEP, "--kernel", kernel],
        "plan": ["plan", "--vocab", "128", "--budget", "1MiB", "--no-reserved", "--kernel", kernel],
        "step": ["step", "--config", "config.json", "--tokens", "8", "--kernel", kernel],
    }[command]
    line = one_line(*run_cli(*argv))
    assert said in line and "config" not in line
    assert "never awaited" not in capsys.readouterr().err


# ... while callables whose call does run the kernel still measure: an instance with a
# plain __call__, a partial that binds the keyword the kernel needs, a lambda.
STILL_KERNELS = {
    "an instance": "class K:\n    def __call__(self, logits, targets, *, chunk_size=None):\n"
    "        return _u(logits, targets)\nk = K()\n",
    "a partial binding a keyword": "import functools\n"
    "def f(logits, targets, *, chunk_size=None, mode):\n    return _u(logits, targets)\n"
    "k = functools.partial(f, mode=1)\n",
    "a lambda": "k = lambda logits, targets, *, chunk_size=None: _u(logits, targets)\n",
}


@pytest.mark.parametrize("what", STILL_KERNELS)
def test_callables_that_run_a_kernel_still_measure(run_cli: Any, here: Path, what: str) -> None:
    kernel = user_module(here, "r19_still", LOGITS + STILL_KERNELS[what]) + ":k"
    code, out, _ = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert rows[0]["peak_bytes"] == rows[1]["peak_bytes"]


def test_a_step_with_an_async_call_is_refused(run_cli: Any, here: Path) -> None:
    body = "class S:\n    async def __call__(self, device):\n        pass\nstep = S()\n"
    name = user_module(here, "r19_async_step", body)
    assert "generator or async" in one_line(*run_cli("profile", f"{name}:step"))


# -- a step whose tensors the tracker never saw: one that ignores the device it is given
# (torch.zeros(64, 64) on --device meta), makes its tensors in a thread of its own, or
# makes none (a step that returns at once, a builtin named by mistake): `profile` printed
# "peak allocated: 0 B" and exit 0, the note blaming a snapshot "recorded without history"

NOTHING_TRACKED = {
    "on the cpu, not the device": (
        "    w = torch.zeros(64, 64, requires_grad=True)\n    (w @ w).sum().backward()\n",
        "elsewhere (",
    ),
    "a model left on the cpu": (
        "    m = torch.nn.Linear(8, 8)\n    m(torch.zeros(2, 8)).sum().backward()\n",
        "none on meta",
    ),
    "in a thread": (
        "    t = threading.Thread(target=lambda: torch.zeros(8, device=device))\n"
        "    t.start()\n    t.join()\n",
        "1 thread(s)",
    ),
    "nothing": ("    return 'done'\n", "made no tensor on meta"),
}


@pytest.mark.parametrize("what", NOTHING_TRACKED)
def test_a_step_whose_tensors_are_not_on_its_device_is_refused(
    run_cli: Any, here: Path, what: str
) -> None:
    inside, said = NOTHING_TRACKED[what]
    body = "import threading\nimport torch\ndef step(device):\n" + inside
    name = user_module(here, "r19_nowhere", body)
    line = one_line(*run_cli("profile", f"{name}:step", "--json"))
    assert said in line


def test_a_builtin_named_as_a_step_is_refused_on_the_cpu_too(run_cli: Any, here: Path) -> None:
    line = one_line(*run_cli("profile", "builtins:repr", "--device", "cpu"))
    assert "made no tensor on cpu" in line


# -- sizes each within MAX_COUNT whose product is past what one torch tensor holds: the
# simulation failed with torch's "Storage size calculation overflowed", and `plan` blamed
# the kernel ("failed in the meta simulation ... run `memprobe sweep --kernel ...` to see
# it"), `step` the model's config ("check the config's sizes"), `sweep` wrote an error row
# per case as if the kernel had failed (exit 0)

BIG = str(2**40)
PAST_TORCH = {
    "sweep b s v": ["sweep", "--device", "meta", "--no-verify", "--no-report", "--no-ladder",
                    "--tokens", BIG, "--vocab", BIG, "--batch", BIG, "--kernel", "unchunked"],
    "sweep v h": ["sweep", "--device", "meta", "--no-verify", "--no-report", "--no-ladder",
                  "--tokens", "64", "--vocab", BIG, "--hidden", BIG,
                  "--kernel", "fused_linear_chunked"],
    "plan b v": ["plan", "--vocab", BIG, "--batch", BIG, "--budget", "1GiB", "--kernel",
                 "unchunked", "--no-reserved"],
    "plan v h": ["plan", "--vocab", BIG, "--hidden", BIG, "--budget", "1GiB", "--kernel",
                 "fused_linear_chunked", "--no-reserved"],
    "step b s": ["step", "--config", "config.json", "--tokens", BIG, "--batch", BIG],
}  # fmt: skip


@pytest.mark.parametrize("what", PAST_TORCH)
def test_sizes_past_one_torch_tensor_are_refused_first(run_cli: Any, here: Path, what: str) -> None:
    (here / "config.json").write_text(json.dumps(SMALL))
    line = one_line(*run_cli(*PAST_TORCH[what]))
    assert "past what one torch tensor holds" in line
    assert "config's sizes" not in line and "failed in the meta simulation" not in line
    assert not (here / "reports").exists()


# ... and on a tensor-parallel rank it is that rank's share that counts: 2^61 elements
# over tp 2 is 2^60 a rank, which a meta sweep simulates.
def test_one_ranks_share_is_what_counts(run_cli: Any, here: Path) -> None:
    code, out, _ = run_cli(*SWEEP, "--kernel", "distributed", "--tp", "2",
                           "--tokens", str(2**21), "--vocab", str(2**40))  # fmt: skip
    assert code == 0 and json.loads(out)["results"][0]["status"] == "ok"


# -- plan --alloc-conf beside --no-reserved: the settings shape the reserved answer alone,
# which --no-reserved turns off; they were parsed and dropped, and the plan printed as if
# they had been applied (a logprob plan and a whole-step one alike)

NO_RESERVED = {
    "logprob": ["--vocab", "1024", "--kernel", "unchunked"],
    "whole step": ["--step", "--config", "config.json", "--kernel", "unchunked"],
    "json": ["--vocab", "1024", "--kernel", "unchunked", "--json"],
}


@pytest.mark.parametrize("what", NO_RESERVED)
@pytest.mark.parametrize("conf", ["expandable_segments:True", "max_split_size_mb:64"])
def test_alloc_conf_with_no_reserved_is_refused(
    run_cli: Any, here: Path, what: str, conf: str
) -> None:
    (here / "config.json").write_text(json.dumps(SMALL))
    argv = ["plan", "--budget", "16MiB", "--no-reserved", "--alloc-conf", conf]
    line = one_line(*run_cli(*argv, *NO_RESERVED[what]))
    assert "--no-reserved" in line and "--alloc-conf" in line


# -- torch's cache directory that cannot be made (TORCHINDUCTOR_CACHE_DIR under a file, or
# naming a file): torch makes it as it imports torch._dynamo at the first backward, so
# every case of a sweep was an error row "NotADirectoryError" (exit 0), and a step's line
# blamed meta ("meta tensors hold no values ... try --device cpu")

CACHE_DIRS = {"under a file": "a_file/cache", "a file": "a_file"}
TORCH_COMMANDS = {
    "sweep": [*SWEEP, "--kernel", "unchunked"],
    "plan": [
        "plan",
        "--vocab",
        "128",
        "--budget",
        "1MiB",
        "--no-reserved",
        "--kernel",
        "unchunked",
    ],
    "profile": ["profile", "{step}:step"],
}


@pytest.mark.parametrize("where", CACHE_DIRS)
@pytest.mark.parametrize("command", TORCH_COMMANDS)
def test_a_torch_cache_directory_that_cannot_be_made_is_named(
    run_cli: Any, here: Path, monkeypatch: pytest.MonkeyPatch, where: str, command: str
) -> None:
    (here / "a_file").write_text("not a directory\n")
    step = user_module(here, "r19_cache", TINY_STEP)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(here / CACHE_DIRS[where]))
    line = one_line(*run_cli(*(a.format(step=step) for a in TORCH_COMMANDS[command])))
    assert "TORCHINDUCTOR_CACHE_DIR=" in line and "--device cpu" not in line
    assert not (here / "reports").exists()
