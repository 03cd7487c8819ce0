"""Hostile inputs, round 10 (flags, user code, environment): each row is a variant of a
defect class the pass found. One line and exit 2, or a sane answer; nothing written is
lost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import user_module
from launch import forked_torchrun

TINY_STEP = (
    "    w = torch.zeros(8, 8, device=device, requires_grad=True)\n    (w @ w).sum().backward()\n"
)
TINY_KERNEL = (
    "from memprobe.kernels import get_kernel\n"
    "def k(logits, targets, *, chunk_size=None):\n"
    "{body}"
    "    return get_kernel('unchunked')(logits, targets)\n"
)


def _memprobe(cwd: Path, *args: str, stdout: str = "captured") -> Any:
    """``memprobe ARGS`` in a process of its own (its exit, descriptors and forks are what
    these tests look at), forked from the server that has imported torch once."""
    return forked_torchrun(list(args), cwd=cwd, nproc=0, timeout=60, stdout=stdout)


# -- a thread user code starts and never ends: memprobe printed its answer, then waited
# for the thread for ever (the interpreter joins every non-daemon thread at exit)

FOREVER = "threading.Thread(target=time.sleep, args=(10**6,), name='r10-forever').start()\n"


@pytest.mark.parametrize("where", ["in the step", "at the step's import", "in a thread's thread"])
def test_a_thread_user_code_leaves_running_does_not_keep_memprobe(
    run_cli: Any, here: Path, where: str
) -> None:
    import threading

    start = {
        "in the step": f"def step(device):\n    {FOREVER}",
        "at the step's import": f"{FOREVER}def step(device):\n",
        "in a thread's thread": (
            "def step(device):\n"
            f"    t = threading.Thread(target=lambda: {FOREVER.strip()})\n    t.start()\n"
            "    t.join()\n"
        ),
    }[where]
    body = "import threading, time, torch\n" + start + TINY_STEP
    name = user_module(here, "r10_forever", body)
    code, out, err = run_cli("profile", f"{name}:step", "--json")
    assert code == 0, err
    assert json.loads(out)["peak_allocated_bytes"] > 0
    left = [t for t in threading.enumerate() if t.name == "r10-forever"]
    assert left and all(t.daemon for t in left)  # the interpreter does not wait for them
    assert not threading.Thread(target=lambda: None).daemon  # Thread.start is put back


def test_a_kernels_thread_left_running_does_not_keep_memprobe(run_cli: Any, here: Path) -> None:
    import threading

    body = "import threading, time\n" + TINY_KERNEL.format(body=f"    {FOREVER}")
    kernel = user_module(here, "r10_kforever", body) + ":k"
    args = ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", kernel, "--no-reserved"]
    code, out, err = run_cli(*args, "--json")
    assert code == 0, err
    assert json.loads(out)[0]["max_tokens"] > 0
    left = [t for t in threading.enumerate() if t.name == "r10-forever"]
    assert left and all(t.daemon for t in left)


@pytest.mark.multiprocess
def test_a_step_whose_thread_never_ends_exits(tmp_path: Path) -> None:
    """The real exit: the process ends with its answer, not at a timeout."""
    body = "import threading, time, torch\n" + f"def step(device):\n    {FOREVER}" + TINY_STEP
    (tmp_path / "r10_hang.py").write_text(body)
    done = _memprobe(tmp_path, "profile", "r10_hang:step", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["peak_allocated_bytes"] > 0


# -- user code that forks (os.fork): the child ran the rest of memprobe too, so `--json`
# printed two objects (no longer JSON) and every output was written twice

FORKS = {
    "in the step, the child raising": (
        "def step(device):\n    if os.fork() == 0:\n        raise RuntimeError('child')\n"
        + TINY_STEP
    ),
    "at import": "os.fork()\ndef step(device):\n" + TINY_STEP,
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("what", sorted(FORKS))
def test_a_step_that_forks_answers_once(tmp_path: Path, what: str) -> None:
    (tmp_path / "r10_forks.py").write_text("import os, torch\n" + FORKS[what])
    done = _memprobe(tmp_path, "profile", "r10_forks:step", "--json", "--out", "p.pickle")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["peak_allocated_bytes"] > 0  # one object: JSON
    assert "Traceback" not in done.stderr and "error" not in done.stderr, done.stderr


@pytest.mark.multiprocess
def test_a_kernel_that_forks_answers_once(tmp_path: Path) -> None:
    body = "import os\n" + TINY_KERNEL.format(body="    os.fork()\n")
    (tmp_path / "r10_kforks.py").write_text(body)
    args = ["--vocab", "256", "--budget", "1GiB", "--kernel", "r10_kforks:k", "--no-reserved"]
    done = _memprobe(tmp_path, "plan", *args, "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["max_tokens"] > 0


# -- a step or kernel in a file whose name Python or an installed package already has
# (./copy.py, ./typer.py): "module 'copy' has no attribute 'step' (check the spelling;
# copy defines Error, copy, deepcopy...)", though the user's copy.py has it


@pytest.mark.parametrize(
    ("name", "is_"),
    [
        ("copy", "already the module at"),
        ("typer", "already the module at"),
        ("memprobe", "already the module at"),
        ("pytest", "already the module at"),
        ("itertools", "a module built into Python"),
    ],
)
@pytest.mark.parametrize("command", ["profile", "plan"])
def test_a_file_named_like_a_module_already_there_is_said_so(
    run_cli: Any, here: Path, name: str, is_: str, command: str
) -> None:
    (here / f"{name}.py").write_text(
        "import torch\ndef step(device):\n" + TINY_STEP + TINY_KERNEL.format(body="")
    )
    if command == "profile":
        args = ["profile", f"{name}:step"]
    else:
        args = ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", f"{name}:k"]
    code, out, err = run_cli(*args)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert f"{name!r} is {is_}" in err and f"./{name}.py is not what that name imports" in err
    assert f"rename yours (e.g. my_{name})" in err and "check the spelling" not in err


def test_a_folder_named_like_a_module_already_there_is_said_so(run_cli: Any, here: Path) -> None:
    (here / "json").mkdir()
    (here / "json" / "steps.py").write_text("def step(device):\n    pass\n")
    code, out, err = run_cli("profile", "json:step")
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "'json' is already the module at" in err and "./json is not what" in err


def test_a_missing_attribute_of_the_module_here_is_still_a_spelling_mistake(
    run_cli: Any, here: Path
) -> None:
    (here / "r10_here.py").write_text("def stepp(device):\n    pass\n")
    code, out, err = run_cli("profile", "r10_here:step")
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "module 'r10_here' has no attribute 'step' (check the spelling" in err


# -- MPLBACKEND naming no backend: matplotlib validates it as it is imported, and every
# command that draws (report, sweep's report, plan --out, attribute --html) ended in its
# traceback, though memprobe draws on Agg whatever it names


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("backend", "args"),
    [
        ("nonesuch", ["report", "{run}", "--out", "r.html"]),
        ("x\x1b[2J", ["report", "{run}", "--out", "r.html"]),
        ("qt9agg", ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel",
                    "unchunked", "--no-verify", "-q", "--out", "o"]),
        ("nonesuch", ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "unchunked",
                      "--no-reserved", "--out", "p"]),
    ],
    ids=["report", "report, control characters", "sweep", "plan --out"],
)  # fmt: skip
def test_a_matplotlib_backend_that_is_none_is_one_line(
    tmp_path: Path, made_run: Path, backend: str, args: list[str]
) -> None:
    # A process of its own: matplotlib reads MPLBACKEND as it is first imported (the
    # forkserver the process comes from has not imported it).
    argv = [a.format(run=made_run) for a in args]
    done = forked_torchrun(argv, cwd=tmp_path, nproc=0, timeout=60, env={"MPLBACKEND": backend})
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"MPLBACKEND={backend!r} in the environment is not a matplotlib backend" in done.stderr
    assert "\x1b" not in done.stderr and "Traceback" not in done.stderr
    assert not any(p.suffix in (".html", ".png") for p in tmp_path.rglob("*"))


@pytest.mark.multiprocess
def test_a_matplotlib_backend_it_knows_still_draws(tmp_path: Path, made_run: Path) -> None:
    argv = ["report", str(made_run), "--out", "r.html"]
    done = forked_torchrun(argv, cwd=tmp_path, nproc=0, timeout=60, env={"MPLBACKEND": "svg"})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.html").is_file()


# -- a mistake in a rank or batch count showed the tokens' example: "--tp '0': 0 must be
# positive (e.g. --tp 1024,2048)", a layout of 1,024 ranks as the way to write it

COUNT_FLAGS = [
    (["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--out", "o"], "--tp", "1,2,4"),
    (["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--out", "o"], "--cp", "1,2,4"),
    (["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--out", "o"], "--batch", "1,2"),
    (["plan", "--vocab", "256", "--budget", "1GiB"], "--tp", "1,2,4"),
    (["plan", "--vocab", "256", "--budget", "1GiB"], "--cp", "1,2,4"),
]


@pytest.mark.parametrize("value", ["0", "-2", "two", "2,,4"])
@pytest.mark.parametrize(
    ("args", "flag", "example"), COUNT_FLAGS, ids=[f"{a[0]} {f}" for a, f, _ in COUNT_FLAGS]
)
def test_a_count_mistake_shows_a_count_as_its_example(
    run_cli: Any, here: Path, args: list[str], flag: str, example: str, value: str
) -> None:
    code, out, err = run_cli(*args, flag, value)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert err.strip().endswith(f"(e.g. {flag} {example})"), err
    assert not (here / "o").exists()


# -- user code writing below sys.stdout (os.write(1, ...), a subprocess it starts): what
# it wrote went into `--json`'s object on standard output, no longer JSON

FD_WRITES = {
    "os.write(1)": "os.write(1, b'RAW-FD-WRITE\\n')",
    "a subprocess": "subprocess.run(['echo', 'RAW-FD-WRITE'], check=True)",
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("what", sorted(FD_WRITES))
@pytest.mark.parametrize("command", ["profile", "plan"])
def test_what_user_code_writes_to_descriptor_1_goes_to_stderr(
    tmp_path: Path, what: str, command: str
) -> None:
    body = (
        "import os, subprocess, torch\n"
        + f"def step(device):\n    {FD_WRITES[what]}\n"
        + TINY_STEP
        + TINY_KERNEL.format(body=f"    {FD_WRITES[what]}\n")
    )
    (tmp_path / "r10_fd.py").write_text(body)
    if command == "profile":
        done = _memprobe(tmp_path, "profile", "r10_fd:step", "--json")
        assert json.loads(done.stdout)["peak_allocated_bytes"] > 0, done.stderr
    else:
        args = ["--vocab", "256", "--budget", "1GiB", "--kernel", "r10_fd:k", "--no-reserved"]
        done = _memprobe(tmp_path, "plan", *args, "--json")
        assert json.loads(done.stdout)[0]["max_tokens"] > 0, done.stderr
    assert done.returncode == 0 and "RAW-FD-WRITE" in done.stderr


@pytest.mark.multiprocess
def test_user_code_with_descriptor_1_closed_still_runs(tmp_path: Path) -> None:
    (tmp_path / "r10_fd.py").write_text(
        "import os, torch\ndef step(device):\n    os.write(2, b'ran')\n" + TINY_STEP
    )
    done = _memprobe(tmp_path, "profile", "r10_fd:step", "--json", stdout="closed")
    assert done.returncode == 0 and "ran" in done.stderr, done.stderr


# -- an output named by a file name that is not UTF-8 (`--out $'r\xff'`, any non-ASCII
# name under LC_ALL=C): Python reads the byte as a lone surrogate, the page quoting the
# name could not be encoded, and the command ended in a traceback after its run was made

ODD = "r\udcffn"  # what Python makes of the bytes b"r\xffn" in a file name


@pytest.mark.parametrize(
    ("args", "made"),
    [
        (["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
          "--no-verify", "-q", "--out", ODD], f"{ODD}/report.html"),
        (["report", "{run}", "--out", f"{ODD}.html"], f"{ODD}.html"),
        (["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "unchunked", "--no-reserved",
          "--out", ODD], f"{ODD}/plan.html"),
        (["gate", "{run}", "--config", "g.toml", "--junit-xml", f"{ODD}.xml"], f"{ODD}.xml"),
    ],
    ids=["sweep --out", "report --out", "plan --out", "gate --junit-xml"],
)  # fmt: skip
def test_an_output_named_in_bytes_that_are_not_utf8_is_written(
    run_cli: Any, made_run: Path, here: Path, args: list[str], made: str
) -> None:
    (here / "g.toml").write_text("[tool.memprobe.gate]\nrules = [{kernel='*', max_peak='1TiB'}]\n")
    code, _, err = run_cli(*[a.format(run=made_run) for a in args])
    assert code == 0 and "Traceback" not in err, err
    text = (here / made).read_bytes().decode("utf-8")  # UTF-8 still
    assert "\ufffd" not in text


def test_a_step_summary_quoting_such_a_name_is_appended(
    run_cli: Any, made_run: Path, here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    run = here / ODD
    shutil.copytree(made_run, run)
    (here / "g.toml").write_text("[tool.memprobe.gate]\nrules = [{kernel='*', max_peak='1TiB'}]\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(here / "summary.md"))
    code, _, err = run_cli("gate", str(run), "--config", "g.toml")
    assert code == 0 and not err, err
    (here / "summary.md").read_bytes().decode("utf-8")


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "args",
    [["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
      "--no-verify", "--out", "r\udcffn"],
     ["profile", "r10_tiny:step", "--out", "p\udcff.pickle"]],
    ids=["sweep", "profile"],
)  # fmt: skip
def test_a_terminal_that_encodes_strictly_gets_the_name_escaped(
    tmp_path: Path, args: list[str]
) -> None:
    """A UTF-8 locale other than C.UTF-8 writes standard output strictly: the name printed
    (run directory, snapshot) raised UnicodeEncodeError."""
    (tmp_path / "r10_tiny.py").write_text("import torch\ndef step(device):\n" + TINY_STEP)
    done = forked_torchrun(
        args, cwd=tmp_path, nproc=0, timeout=60, env={"PYTHONIOENCODING": "utf-8:strict"}
    )
    assert done.returncode == 0, done.stderr
    assert "\\udcff" in done.stdout and "Traceback" not in done.stderr


# -- anomaly detection turned on by user code: it reads every gradient's values, so on meta
# every case after the kernel that turned it on failed, memprobe's own kernels included

ANOMALY = {
    "on": "torch.autograd.set_detect_anomaly(True)",
    "on, no nan check": "torch.autograd.set_detect_anomaly(True, check_nan=False)",
    "entered, never left": "torch.autograd.detect_anomaly().__enter__()",
}


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")  # the user's doing
@pytest.mark.parametrize("what", sorted(ANOMALY))
def test_anomaly_detection_user_code_turns_on_is_put_back(
    run_cli: Any, here: Path, what: str
) -> None:
    import torch

    body = "import torch\n" + TINY_KERNEL.format(body=f"    {ANOMALY[what]}\n")
    kernel = user_module(here, "r10_anomaly", body) + ":k"
    flags = ["--tokens", "64", "--vocab", "256", "--no-ladder", "-q", "--device", "meta"]
    args = [*flags, "--no-verify", "--kernel", f"{kernel},unchunked,local_chunked"]
    code, _, err = run_cli("sweep", *args, "--no-report", "--out", "o")
    assert code == 0, err
    rows = json.loads((here / "o" / "results.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok"] * 3, [r["note"] for r in rows]
    assert rows[0]["peak_bytes"] == rows[1]["peak_bytes"]  # the kernel is unchunked
    assert not torch.is_anomaly_enabled()


# -- the hidden route (--fused, a hidden-family kernel) under FSDP2 (--fsdp, --cp): the
# step failed with "FSDP requires a single root module ... (fix the step and rerun)", and
# `plan --step --fsdp N` compared the hidden family by default, failing after minutes


@pytest.mark.parametrize(
    "args",
    [
        ["step", "--tokens", "64", "--fsdp", "2", "--fused"],
        ["step", "--tokens", "64", "--cp", "2", "--fused"],
        ["step", "--tokens", "64", "--fsdp", "2", "--kernel", "linear_unchunked"],
        ["plan", "--step", "--budget", "1GiB", "--fsdp", "2", "--no-reserved",
         "--kernel", "local_chunked,linear_local_chunked"],
        ["plan", "--step", "--budget", "1GiB", "--cp", "2", "--no-reserved",
         "--kernel", "fused_linear_chunked"],
    ],
    ids=["step --fsdp --fused", "step --cp --fused", "step --fsdp hidden kernel",
         "plan --step --fsdp", "plan --step --cp"],
)  # fmt: skip
def test_the_hidden_route_under_fsdp_is_refused_before_it_runs(
    run_cli: Any, tmp_path: Path, args: list[str]
) -> None:
    from small_config import SMALL

    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    code, out, err = run_cli(*args[:1], "--config", str(tmp_path), *args[1:])
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "under FSDP2 (--fsdp/--cp) is not simulated" in err
    assert "fix the step" not in err and "[1/" not in err  # before any simulation


def test_plan_steps_default_kernels_leave_the_hidden_route_out_under_fsdp(
    tmp_path: Path,
) -> None:
    from small_config import SMALL

    from memprobe.commands.step import build_step
    from memprobe.plan.whole_step import step_kernels
    from memprobe.profile.sharded import sharding_from_flags

    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    hidden = set(step_kernels()) - set(step_kernels(hidden=False))
    assert "fused_linear_chunked" in hidden
    for fsdp, cp, simulated in [(1, 1, True), (2, 1, False), (1, 2, False)]:
        sharding = sharding_from_flags(fsdp=fsdp, cp=cp)
        step = build_step(tmp_path, tokens=8, sharding=sharding)
        assert step.hidden_route_simulated is simulated
