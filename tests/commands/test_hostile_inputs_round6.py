"""Hostile inputs, round 6: user code that leaves by a BaseException or moves the current
directory, standard output that cannot be written, output paths that are link loops,
torchrun's variables set by someone else, a step summary that is not a file, and
transformers' own words on stderr. Each row is one line and exit 2 (or a sane answer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile import user_module
from launch import forked_torchrun
from small_config import SMALL

from memprobe.errors import UserError
from memprobe.gate.rules import Verdict
from memprobe.io.files import guard_outputs, resolved_path
from memprobe.kernels.user import UserCodeExit, user_code
from memprobe.measure.torchrun_env import under_torchrun
from memprobe.render.markdown import append_step_summary

# How user code can leave by a BaseException that is not an Exception, and what the one
# line says of it.
LEAVES = {
    "a class of its own": (
        "class Stop(BaseException):\n    pass\nLEAVE = Stop('out of here')\n",
        "raised Stop: out of here (a BaseException, not an Exception)",
    ),
    "GeneratorExit": ("LEAVE = GeneratorExit()\n", "raised GeneratorExit (a BaseException"),
    "pytest.skip()": (
        "import pytest\ntry:\n    pytest.skip('later')\n"
        "except BaseException as e:\n    LEAVE = e\n",
        "raised Skipped: later",
    ),
    "a bare BaseException": ("LEAVE = BaseException()\n", "raised BaseException (a Base"),
}


@pytest.mark.parametrize("how", sorted(LEAVES))
def test_a_step_leaving_by_a_base_exception_is_one_line(run_cli, here: Path, how: str) -> None:
    prelude, says = LEAVES[how]
    name = user_module(here, "r6_step", prelude + "def step(device):\n    raise LEAVE\n")
    code, out, err = run_cli("profile", f"{name}:step", "--out", "p.pickle")
    assert code == 2 and not out, err
    (line,) = err.strip().splitlines()
    assert f"the step {says}" in line, line
    assert not (here / "p.pickle").exists()


@pytest.mark.parametrize("how", sorted(LEAVES))
def test_a_module_leaving_by_a_base_exception_on_import_is_one_line(
    run_cli, here: Path, how: str
) -> None:
    prelude, _ = LEAVES[how]
    name = user_module(here, "r6_import", prelude + "raise LEAVE\n")
    code, _, err = run_cli("profile", f"{name}:step")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"importing {name!r} failed: " in err and "Traceback" not in err


@pytest.mark.parametrize("how", sorted(LEAVES))
def test_a_kernel_leaving_by_a_base_exception(run_cli, here: Path, how: str) -> None:
    prelude, says = LEAVES[how]
    body = prelude + "def k(logits, targets, *, chunk_size=None):\n    raise LEAVE\n"
    kernel = user_module(here, "r6_kernel", body) + ":k"
    code, out, err = run_cli("plan", "--vocab", "256", "--budget", "1GiB", "--kernel", kernel)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert f"{kernel} failed in the meta simulation" in err and says in err
    flags = ["--tokens", "64", "--vocab", "256", "--no-ladder", "-q", "--device", "meta"]
    code, _, err = run_cli(
        "sweep", "--no-report", *flags, "--no-verify", "--kernel", kernel, "--out", "o"
    )
    assert code == 0, err
    (row,) = json.loads((here / "o" / "results.json").read_text())["rows"]
    assert row["status"] == "error" and says in row["note"]


def test_ctrl_c_and_memprobes_own_unwinding_pass_through_user_code() -> None:
    from memprobe.measure.rank_agreement import PeerFailed

    with pytest.raises(KeyboardInterrupt), user_code("the step"):
        raise KeyboardInterrupt
    # memprobe's own is marked as it is raised (round 24: an Unwind user code raised is its)
    with pytest.raises(PeerFailed), user_code("chunked_distributed"):
        raise PeerFailed("oom", 1, "out of memory").issued()
    with pytest.raises(UserCodeExit, match="the step called sys.exit"), user_code("the step"):
        sys.exit(0)


# Where user code moves the current directory to: memprobe's relative outputs still land
# where they were asked for.
MOVES = {
    "a folder of its own": "os.makedirs('elsewhere', exist_ok=True)\n    os.chdir('elsewhere')",
    "the root": "os.chdir('/')",
    "a folder it then removes": (
        "os.makedirs('gone', exist_ok=True)\n    os.chdir('gone')\n    os.rmdir(os.getcwd())"
    ),
}


@pytest.mark.parametrize("where", sorted(MOVES))
def test_a_step_that_moves_the_current_directory(run_cli, here: Path, where: str) -> None:
    body = "import os, torch\ndef step(device):\n    torch.empty(10, device=device)\n    "
    name = user_module(here, "r6_chdir", body + MOVES[where] + "\n")
    code, _, err = run_cli("profile", f"{name}:step", "--out", "p.pickle", "--html", "p.html")
    assert code == 0, err
    assert (here / "p.pickle").is_file() and (here / "p.html").is_file()
    assert Path.cwd() == here


@pytest.mark.parametrize("where", sorted(MOVES))
def test_a_kernel_or_module_that_moves_the_current_directory(
    run_cli, here: Path, where: str
) -> None:
    body = (
        "import os\nimport torch\nfrom memprobe.kernels import get_kernel\n"
        "def k(logits, targets, *, chunk_size=None):\n    "
        + MOVES[where]
        + "\n    return get_kernel('unchunked')(logits, targets)\n"
    )
    kernel = user_module(here, "r6_kchdir", body) + ":k"
    flags = ["--tokens", "64", "--vocab", "256", "--no-ladder", "-q", "--device", "meta"]
    code, _, err = run_cli(
        "sweep", "--no-report", *flags, "--no-verify", "--kernel", kernel, "--out", "o"
    )
    assert code == 0, err
    (row,) = json.loads((here / "o" / "results.json").read_text())["rows"]
    assert row["status"] == "ok" and Path.cwd() == here
    at_import = user_module(here, "r6_ichdir", "import os\n" + MOVES[where].replace("\n    ", "\n"))
    code, _, err = run_cli("profile", f"{at_import}:step")
    assert code == 2 and "has no attribute 'step'" in err and Path.cwd() == here


# Standard output that cannot be written (``> /dev/full``, ``>&-``, a pipe whose reader
# left): one line or a quiet end, never a traceback.
OUTPUTS = {
    "the full device": ("full", 2, "cannot write the output: No space left on device"),
    "closed": ("closed", 0, ""),
    "a reader that left": ("reader gone", 0, ""),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("what", sorted(OUTPUTS))
def test_standard_output_that_cannot_be_written(tmp_path: Path, what: str) -> None:
    from memprobe.snapshot import synthesize_snapshot, write_snapshot

    stdout, code, says = OUTPUTS[what]
    events: list[Any] = []
    snap = write_snapshot(synthesize_snapshot(events), tmp_path / "s")
    argv = ["diff", str(snap), str(snap)]
    done = forked_torchrun(argv, cwd=tmp_path, nproc=0, timeout=60, stdout=stdout)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == ([f"memprobe: error: {says}"] if says else []), done.stderr


@pytest.mark.parametrize(
    "make",
    [
        "ln -s loop loop",
        "ln -s a b && ln -s b a && ln -s a loop",
        "mkdir d && ln -s ../loop d/x && ln -s d/x loop",
    ],
)
def test_an_output_that_is_a_link_loop_is_one_line(tmp_path: Path, make: str) -> None:
    subprocess.run(make, shell=True, cwd=tmp_path, check=True)
    with pytest.raises(UserError, match="--out .*loop cannot be followed"):
        guard_outputs({"--out": tmp_path / "loop"}, [])
    with pytest.raises(UserError, match="input .*loop cannot be followed"):
        guard_outputs({"--out": tmp_path / "new"}, [tmp_path / "loop"])
    assert resolved_path(tmp_path / "new", "--out") == (tmp_path / "new").resolve()


@pytest.mark.parametrize(
    "command",
    [
        ["profile", "r6_none:step", "--out", "{loop}"],
        ["attribute", "{snap}", "--html", "{loop}"],
        ["report", "{run}", "--out", "{loop}"],
        ["gate", "{run}", "--junit-xml", "{loop}"],
    ],
)
def test_commands_refuse_a_link_loop_output(run_cli, made_run: Path, here: Path, command) -> None:
    (here / "loop").symlink_to("loop")
    (here / "r6_none.py").write_text("def step(device):\n    pass\n")
    (here / "pyproject.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{ kernel = "*", max_peak = "1 GiB" }]\n'
    )
    snap = next((made_run / "snapshots").glob("*.pickle"))
    args = [a.format(loop=here / "loop", snap=snap, run=made_run) for a in command]
    code, _, err = run_cli(*args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "cannot be followed: a loop of links" in err


# torchrun's variables as someone else left them: (environment, words of the one line).
TORCHRUN = [
    ({"WORLD_SIZE": "two", "RANK": "0"}, "WORLD_SIZE='two' in the environment"),
    ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE='0'"),
    ({"WORLD_SIZE": "2", "RANK": "-1"}, "RANK='-1'"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 in the environment is not below WORLD_SIZE=2"),
    ({"WORLD_SIZE": "2", "RANK": "١"}, "RANK='١'"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "x"}, "LOCAL_RANK='x'"),
    ({"WORLD_SIZE": "1", "RANK": "0"}, "MASTER_ADDR is not: this is not a torchrun rank"),
    ({"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "h"}, "MASTER_PORT is not"),
    ({"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "99999"}, "not a port"),
    ({"WORLD_SIZE": "9" * 30, "RANK": "0"}, "is not a whole number"),
]


@pytest.mark.parametrize(("env", "says"), TORCHRUN)
def test_torchrun_variables_left_by_someone_else(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError) as caught:
        under_torchrun()
    assert says in caught.value.message and "unset WORLD_SIZE and RANK" in caught.value.hint


def test_a_sweep_under_stray_torchrun_variables_is_one_line(
    run_cli, here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "two")
    monkeypatch.setenv("RANK", "zz")
    flags = ["--tokens", "64", "--vocab", "128", "--no-ladder", "-q", "--device", "meta"]
    for extra in ([], ["--shard"]):
        code, _, err = run_cli("sweep", "--no-report", *flags, "--no-verify", "--out", "o", *extra)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "WORLD_SIZE='two'" in err and not (here / "o").exists()


def test_torchrun_as_torchrun_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "3",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    assert under_torchrun()
    monkeypatch.delenv("RANK")
    assert not under_torchrun()


@pytest.mark.parametrize("what", ["a FIFO", "a folder", "/dev/full", "a missing folder"])
def test_a_step_summary_that_is_not_a_file_warns_without_waiting(tmp_path: Path, what) -> None:
    target = {
        "a FIFO": tmp_path / "fifo",
        "a folder": tmp_path,
        "/dev/full": Path("/dev/full"),
        "a missing folder": tmp_path / "no" / "summary.md",
    }[what]
    if what == "a FIFO":
        os.mkfifo(target)
    os.environ["GITHUB_STEP_SUMMARY"] = str(target)
    try:
        warning = append_step_summary(Verdict(checks=(), results="run", cases=0))
    finally:
        del os.environ["GITHUB_STEP_SUMMARY"]
    assert warning is not None and warning.startswith("could not append to GITHUB_STEP_SUMMARY")


def test_a_step_summary_file_is_still_appended(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "summary.md"
    target.write_text("before\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
    assert append_step_summary(Verdict(checks=(), results="run", cases=0)) is None
    text = target.read_text()
    assert text.startswith("before\n") and "memprobe gate" in text


# Configs transformers takes with a warning of its own on stderr, or builds into a model
# torch refuses: (what, config, words of the one line).
HF_CONFIGS = [
    (
        "a rope type with an escape sequence",
        {**SMALL, "rope_scaling": {"rope_type": "\x1b[31mmine", "factor": 2.0}},
        "transformers cannot build this model",
    ),
    ("a pad token outside the vocabulary", {**SMALL, "pad_token_id": 100000}, "Padding_idx"),
    (
        "phi3's default pad token above a small vocabulary",
        {**SMALL, "model_type": "phi3"},
        "Padding",
    ),
    ("a negative pad token far below", {**SMALL, "pad_token_id": -1000}, "Padding_idx"),
]


@pytest.mark.parametrize(("what", "config", "says"), HF_CONFIGS, ids=[c[0] for c in HF_CONFIGS])
def test_transformers_words_never_reach_stderr(run_cli, here: Path, what, config, says) -> None:
    pytest.importorskip("transformers")
    (here / "c.json").write_text(json.dumps(config))
    code, out, err = run_cli("step", "--config", "c.json", "--tokens", "64")
    assert code == 2 and not out, err
    (line,) = err.strip().splitlines()
    assert line.startswith("memprobe: error: ") and says in line and "\x1b" not in err
    assert "on meta" not in line  # a config's mistake, not meta's


# A plain function that hands back what would run its body (round 4 refused generator and
# async functions; a function returning one read as an empty step, exit 0).
RETURNS = {
    "a generator": "def body(device):\n    yield torch.empty(8, device=device)\n",
    "a coroutine": "async def body(device):\n    torch.empty(8, device=device)\n",
    "an async generator": "async def body(device):\n    yield 1\n",
    "an awaitable object": "class body:\n    def __init__(self, d):\n        pass\n"
    "    def __await__(self):\n        yield\n",
}


@pytest.mark.parametrize("what", sorted(RETURNS))
def test_a_step_returning_what_would_run_its_body_is_one_line(
    run_cli, here: Path, what: str
) -> None:
    body = "import torch\n" + RETURNS[what] + "def step(device):\n    return body(device)\n"
    name = user_module(here, "r6_returns", body)
    code, out, err = run_cli("profile", f"{name}:step", "--out", "p.pickle")
    assert code == 2 and not out, err
    (line,) = err.strip().splitlines()
    assert "the step returned " in line and "none of its body ran" in line, line
    assert not (here / "p.pickle").exists()


def test_a_step_returning_a_value_is_still_profiled(run_cli, here: Path) -> None:
    body = "import torch\ndef step(device):\n    return [torch.empty(8, device=device), 'done']\n"
    name = user_module(here, "r6_value", body)
    code, _, err = run_cli("profile", f"{name}:step", "--out", "p.pickle")
    assert code == 0 and (here / "p.pickle").is_file(), err
