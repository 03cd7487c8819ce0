"""Hostile inputs, round 8 (command lines, configs, user code, environments): each row is
a variant of a defect class the round's pass found. One line and exit 2, or a sane answer;
nothing written is lost."""

from __future__ import annotations

import io
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
from memprobe.io.sizes import parse_budget, parse_size

ROOT = Path(__file__).resolve().parents[2]


# -- a negative zero is zero: "-0" was called negative, where "0" is "must be more than 0"


@pytest.mark.parametrize("text", ["-0", "-0GiB", " -0.0 MiB", "-0_000", "-0,000 B"])
def test_a_negative_zero_is_zero(text: str) -> None:
    assert parse_size(text, what="--other") == 0
    with pytest.raises(UserError) as caught:
        parse_budget(text)
    line = caught.value.one_line()
    assert "must be more than 0 bytes" in line and "it is 0 bytes" in line
    assert "negative" not in line


@pytest.mark.parametrize(
    ("text", "says"),
    [("-1", "is negative"), ("-0.5", "is negative"), ("-x", "is not a size"), ("--5", "not a")],
)
def test_what_is_below_zero_or_no_size_is_still_said_so(text: str, says: str) -> None:
    with pytest.raises(UserError, match=says):
        parse_size(text, what="--other")


@pytest.mark.parametrize("budget", ["-0", "0", "0.4B", "-0 GiB"])
def test_report_refuses_a_budget_of_nothing_as_the_others_do(
    run_cli: Any, made_run: Path, budget: str
) -> None:
    # report read its --budget as any size: 0 was taken and drawn, -0 was "negative".
    code, out, err = run_cli("report", str(made_run), "--budget", budget)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    if budget == "0.4B":  # a fraction of a byte is no count of bytes at all
        assert "--budget '0.4B' is not a whole number of bytes" in err, err
    else:
        assert f"--budget {budget!r} must be more than 0 bytes (it is 0 bytes" in err


# -- a reader that left early: `memprobe kernels | true` exited 1 (click's own handling)


class _LeftReader(io.StringIO):
    """A standard output whose reader has gone: every write and flush is a broken pipe."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def _run_with_left_reader(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    from memprobe import cli

    err = io.StringIO()
    monkeypatch.setattr(sys, "argv", ["memprobe", *args])
    monkeypatch.setattr(sys, "stdout", _LeftReader())
    monkeypatch.setattr(sys, "stderr", err)
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return code, err.getvalue()


GATE_RULES = {
    "passes": ('{ kernel = "unchunked", max_peak = "1TiB" }', 0),
    "fails": ('{ kernel = "unchunked", max_peak = "1 B" }', 1),
}


@pytest.mark.parametrize(
    "args",
    [
        ["kernels"],
        ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "local_chunked",
         "--no-reserved"],
        ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "unchunked", "--json",
         "--no-reserved"],
    ],
)  # fmt: skip
def test_a_reader_that_left_is_no_error(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    code, err = _run_with_left_reader(monkeypatch, *args)
    assert code == 0 and "Traceback" not in err and "error" not in err, err


@pytest.mark.parametrize("verdict", sorted(GATE_RULES))
def test_a_gates_verdict_stands_when_its_reader_left(
    monkeypatch: pytest.MonkeyPatch, made_run: Path, here: Path, verdict: str
) -> None:
    rule, expected = GATE_RULES[verdict]
    (here / "gate.toml").write_text(f"[tool.memprobe.gate]\nrules = [{rule}]\n")
    code, err = _run_with_left_reader(monkeypatch, "gate", str(made_run), "--config", "gate.toml")
    assert code == expected and "Traceback" not in err, err


@pytest.mark.multiprocess
def test_kernels_into_a_pipe_whose_reader_left_exits_0(tmp_path: Path) -> None:
    """A real pipe whose reader left before the first write: the writer's own status."""
    done = forked_torchrun(["kernels"], cwd=tmp_path, nproc=0, timeout=60, stdout="reader gone")
    assert done.returncode == 0 and not done.stderr, done.stderr


# -- an exception from user code whose message cannot be made: its __str__ raised inside
# memprobe's own error handling, a traceback where the failure was to be one line or a row

UNREADABLE = (
    "class E({base}):\n    def __str__(self):\n        raise ValueError('no message for you')\n"
)


@pytest.mark.parametrize("base", ["Exception", "RuntimeError", "KeyError"])
def test_a_kernel_raising_an_unprintable_exception(run_cli: Any, here: Path, base: str) -> None:
    body = (
        UNREADABLE.format(base=base)
        + "def k(logits, targets, *, chunk_size=None):\n    raise E()\n"
    )
    kernel = user_module(here, "r8_unreadable", body) + ":k"
    flags = ["--tokens", "64", "--vocab", "256", "--no-ladder", "-q", "--device", "meta"]
    code, _, err = run_cli("sweep", *flags, "--no-verify", "--kernel", kernel, "--out", "o")
    assert code == 0 and "Traceback" not in err, err
    (row,) = json.loads((here / "o" / "results.json").read_text())["rows"]
    assert row["status"] == "error" and "E: (its message could not be read" in row["note"]
    code, out, err = run_cli("plan", "--vocab", "256", "--budget", "1GiB", "--kernel", kernel)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "failed in the meta simulation" in err and "could not be read" in err


@pytest.mark.parametrize(
    ("base", "where"),
    [("Exception", "step"), ("BaseException", "step"), ("Exception", "import"),
     ("BaseException", "import")],
)  # fmt: skip
def test_a_step_or_module_raising_an_unprintable_exception(
    run_cli: Any, here: Path, base: str, where: str
) -> None:
    body = UNREADABLE.format(base=base)
    body += "def step(device):\n    raise E()\n" if where == "step" else "raise E()\n"
    name = user_module(here, "r8_unreadable_step", body)
    code, out, err = run_cli("profile", f"{name}:step", "--out", "p.pickle")
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "could not be read" in err and "Traceback" not in err
    assert not (here / "p.pickle").exists()


def test_exception_text_is_one_bounded_printable_line() -> None:
    from memprobe.io.text import exception_text

    assert exception_text(RuntimeError("a\nb\x1b[31m")) == "RuntimeError: a b\\x1b[31m"
    assert exception_text(KeyError()) == "KeyError"
    assert len(exception_text(RuntimeError("x" * 10**6))) == 200


# -- a kernel whose own attributes raise when memprobe reads its signature: a traceback

ODD_CALLABLES = {
    "__signature__ raises": (
        "class K:\n    @property\n    def __signature__(self):\n        raise RuntimeError('sig')\n"
        "    def __call__(self, logits, targets, *, chunk_size=None):\n        return logits\n"
        "k = K()\n"
    ),
    "__getattr__ raises": (
        "class K:\n    def __getattr__(self, name):\n        raise RuntimeError(name)\n"
        "    def __call__(self, logits, targets, *, chunk_size=None):\n        return logits\n"
        "k = K()\n"
    ),
    "__doc__ raises": (
        "class K:\n    @property\n    def __doc__(self):\n        raise RuntimeError('doc')\n"
        "    def __call__(self, logits, targets, *, chunk_size=None):\n        return logits\n"
        "k = K()\n"
    ),
}


@pytest.mark.parametrize("what", sorted(ODD_CALLABLES))
def test_a_kernel_that_cannot_be_read_is_one_line(run_cli: Any, here: Path, what: str) -> None:
    kernel = user_module(here, "r8_odd", ODD_CALLABLES[what]) + ":k"
    code, out, err = run_cli("plan", "--vocab", "256", "--budget", "1GiB", "--kernel", kernel)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert f"kernel {kernel!r} cannot be read as a kernel: RuntimeError" in err


# -- standard error that cannot be written: a usage error exited 1 (its message raised)


@pytest.mark.multiprocess
@pytest.mark.parametrize("stderr", ["full", "closed"])
def test_a_usage_error_keeps_exit_2_when_stderr_cannot_be_written(
    tmp_path: Path, stderr: str
) -> None:
    """``2>/dev/full`` and ``2>&-``, in a process of its own."""
    argv = ["report", "nowhere", "--budget", "0"]
    done = forked_torchrun(argv, cwd=tmp_path, nproc=0, timeout=60, stderr=stderr)
    assert done.returncode == 2 and not done.stdout


def test_a_full_stderr_in_process_is_no_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    from memprobe import cli

    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(sys, "argv", ["memprobe", "plan", "--vocab", "x"])
    monkeypatch.setattr(sys, "stderr", Full())
    with pytest.raises(SystemExit) as leaving:
        cli.main()
    assert leaving.value.code == 2


# -- user code and standard output: a step's print() went into `profile --json`'s JSON, and
# a step that closed or replaced sys.stdout took memprobe's answer with it

STREAM_CODE = {
    "prints": "print('USER-PRINT')",
    "closes stdout": "sys.stdout.close()",
    "replaces stdout with None": "sys.stdout = None",
    "closes stderr": "sys.stderr.close()",
    "replaces both": "sys.stdout = sys.stderr = open(os.devnull, 'w')",
}
TINY_STEP = (
    "    w = torch.zeros(8, 8, device=device, requires_grad=True)\n    (w @ w).sum().backward()\n"
)


@pytest.mark.parametrize("what", sorted(STREAM_CODE))
def test_a_step_cannot_take_standard_output(run_cli: Any, here: Path, what: str) -> None:
    body = f"import os, sys, torch\ndef step(device):\n    {STREAM_CODE[what]}\n" + TINY_STEP
    name = user_module(here, "r8_streams", body)
    code, out, err = run_cli("profile", f"{name}:step", "--json")
    assert code == 0, err
    assert json.loads(out)["peak_allocated_bytes"] > 0  # stdout is the reading, whole
    assert ("USER-PRINT" in err) == (what == "prints")


@pytest.mark.parametrize("what", ["prints", "closes stdout", "replaces stdout with None"])
def test_a_kernel_cannot_take_standard_output(run_cli: Any, here: Path, what: str) -> None:
    body = (
        "import os, sys\nfrom memprobe.kernels import get_kernel\n"
        f"{STREAM_CODE[what]}\n"  # at import too
        "def k(logits, targets, *, chunk_size=None):\n"
        f"    {STREAM_CODE[what]}\n"
        "    return get_kernel('unchunked')(logits, targets)\n"
    )
    kernel = user_module(here, "r8_kstreams", body) + ":k"
    args = ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", kernel, "--no-reserved"]
    code, out, err = run_cli(*args, "--json")
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["kernel"] == kernel and row["max_tokens"] > 0


# -- a file or folder given as '' or ' ' (a quoted, unset shell variable): typer read it as
# '.', so `report ''` re-rendered the current directory and `plan --out ''` wrote there, or
# as not given (`plan --other-from ''` planned with other 0 B); `--chunk-size ''` was 1024

BLANK_PATHS = [
    (["report", "{blank}"], "RUN_DIR"),
    (["report", "{run}", "--out", "{blank}"], "--out"),
    (["gate", "{blank}"], "RESULTS"),
    (["gate", "{run}", "--junit-xml", "{blank}"], "--junit-xml"),
    (["attribute", "{blank}"], "SNAPSHOT"),
    (["diff", "{blank}", "{blank}"], "A"),
    (["plan", "--vocab", "256", "--budget", "1GiB", "--out", "{blank}"], "--out"),
    (["plan", "--vocab", "256", "--budget", "1GiB", "--other-from", "{blank}"], "--other-from"),
    (["plan", "--vocab", "256", "--budget", "1GiB", "--from-run={blank}"], "--from-run"),
    (["sweep", "--tokens", "64", "--vocab", "256", "--out", "{blank}"], "--out"),
    (["sweep", "--resume", "{blank}"], "--resume"),
    (["step", "--config", "{blank}", "--tokens", "8"], "--config"),
    (["profile", "m:step", "--html", "{blank}"], "--html"),
]


@pytest.mark.parametrize("blank", ["", " ", "\t"])
@pytest.mark.parametrize(("args", "named"), BLANK_PATHS, ids=[" ".join(a) for a, _ in BLANK_PATHS])
def test_a_blank_path_is_refused(
    run_cli: Any, made_run: Path, here: Path, args: list[str], named: str, blank: str
) -> None:
    argv = [a.format(blank=blank, run=made_run) for a in args]
    before = sorted(p.name for p in here.iterdir())
    code, out, err = run_cli(*argv)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert f"Invalid value for '{named}': {blank!r} names no file or folder" in err
    assert sorted(p.name for p in here.iterdir()) == before  # nothing written here


def test_a_blank_alloc_conf_is_still_the_default_settings(run_cli: Any, here: Path) -> None:
    args = ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "local_chunked"]
    code, _, err = run_cli(*args, "--no-reserved", "--alloc-conf", "")
    assert code == 0, err


@pytest.mark.parametrize("chunk", ["", " "])
def test_plan_refuses_a_blank_chunk_size_as_sweep_does(run_cli: Any, chunk: str) -> None:
    args = ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "local_chunked"]
    code, out, err = run_cli(*args, "--chunk-size", chunk)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert f"--chunk-size {chunk!r}" in err and "is not a whole number" in err


# -- a rank whose torchrun store cannot be reached (no rank 0 at MASTER_ADDR:MASTER_PORT, a
# port taken): torch's DistNetworkError ended it with a traceback after the wait

TORCHRUN_ENV = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "1"}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "patched"),
    [
        (["sweep", "--tokens", "64", "--vocab", "256", "--no-ladder", "--device", "meta",
          "--kernel", "local_chunked", "--shard", "--out", "o", "-q"], "rendezvous"),
        (["sweep", "--tokens", "64", "--vocab", "256", "--no-ladder", "--device", "cpu",
          "--kernel", "chunked_distributed", "--tp", "2", "--out", "o", "-q"],
         "init_process_group"),
    ],
    ids=["--shard", "--tp 2"],
)  # fmt: skip
def test_a_store_that_cannot_be_reached_is_one_line(
    run_cli: Any, here: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], patched: str
) -> None:
    import torch.distributed as dist

    def unreachable(*_: Any, **__: Any) -> Any:
        raise dist.DistNetworkError("The client socket has timed out after 300000ms")

    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(dist, patched, unreachable)
    code, out, err = run_cli(*args)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "rank 1 of 2 cannot reach torchrun's store at 127.0.0.1:1 (DistNetworkError" in err
    assert not (here / "o").exists()


# -- torch's process-wide defaults changed by user code: a kernel that turned gradients off
# failed every case after its own (memprobe's unchunked row read 'does not require grad')

TORCH_STATE = {
    "gradients off": "torch.set_grad_enabled(False)",
    "default dtype float64": "torch.set_default_dtype(torch.float64)",
    "default device cpu": "torch.set_default_device('cpu')",
    "default device meta": "torch.set_default_device('meta')",
}


@pytest.mark.parametrize("what", sorted(TORCH_STATE))
def test_user_code_leaves_torchs_defaults_as_it_found_them(
    run_cli: Any, here: Path, what: str
) -> None:
    import torch

    body = (
        "import torch\nfrom memprobe.kernels import get_kernel\n"
        "def k(logits, targets, *, chunk_size=None):\n"
        "    out = get_kernel('unchunked')(logits, targets)\n"
        f"    {TORCH_STATE[what]}\n"
        "    return out\n"
    )
    kernel = user_module(here, "r8_torch_state", body) + ":k"
    flags = ["--tokens", "64", "--vocab", "256", "--no-ladder", "-q", "--device", "meta"]
    args = [*flags, "--no-verify", "--kernel", f"{kernel},unchunked,local_chunked"]
    code, _, err = run_cli("sweep", *args, "--no-report", "--out", "o")
    assert code == 0, err
    rows = json.loads((here / "o" / "results.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok"] * 3, [r["note"] for r in rows]
    assert rows[0]["peak_bytes"] == rows[1]["peak_bytes"]  # the kernel is unchunked
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32
    assert torch.get_default_device() == torch.device("cpu")


# -- started in a directory since removed: torch's oneMKL said "FATAL ERROR: Cannot load
# libtorch_cpu.so", and gate's search for pyproject.toml ended in a traceback


@pytest.mark.parametrize(
    "args",
    [["kernels"], ["gate", "{run}"], ["plan", "--vocab", "256", "--budget", "1GiB"],
     ["sweep", "--tokens", "64", "--vocab", "256", "--out", "o"]],
    ids=["kernels", "gate", "plan", "sweep"],
)  # fmt: skip
def test_a_removed_current_directory_is_one_line(
    tmp_path: Path, made_run: Path, args: list[str]
) -> None:
    import shlex

    gone = tmp_path / "gone"
    gone.mkdir()
    argv = " ".join(shlex.quote(a.format(run=made_run)) for a in args)
    command = f"cd {gone} && rmdir {gone} && {sys.executable} -m memprobe {argv}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and not done.stdout, done.stderr
    assert done.stderr == (
        "memprobe: error: the current directory no longer exists "
        "(cd to a directory that exists and run it again)\n"
    )


# -- config.json sizes that do not fit each other: the step failed on meta at a tensor op,
# with a hint that blamed meta ("try --device cpu"); and config files whose trouble was
# not said (a JSON array "has no model_type", "not readable JSON (UnicodeDecodeError)")

MISFITS = [
    ("kv heads 3 of 4", {"num_key_value_heads": 3}, "num_key_value_heads (3) does not divide"),
    ("kv heads 8 of 4", {"num_key_value_heads": 8}, "num_key_value_heads (8) does not divide"),
    (
        "mixtral: 4 experts per token of 2",
        {"model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 4},
        "num_experts_per_tok is 4 with num_local_experts 2",
    ),
    (
        "qwen2_moe: 8 experts per token of 4",
        {"model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 8,
         "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64},
        "num_experts_per_tok is 8 with num_experts 4",
    ),
]  # fmt: skip
FILES = [
    ("latin-1", '{"model_type": "llama", "name": "caf\xe9"}'.encode("latin-1"), "not UTF-8 text"),
    ("a JSON array", b"[1, 2]", "holds a JSON array, not an object"),
    ("JSON null", b"null", "holds a JSON null, not an object"),
    ("model_type a number", b'{"model_type": 123}', "gives model_type 123, not a name"),
    ("cut short", b'{"model_type": "llama",', "not readable JSON (Expecting property name"),
]


@pytest.mark.parametrize("command", ["step", "plan"])
@pytest.mark.parametrize(
    ("what", "text", "says"),
    [(w, json.dumps({**SMALL, **f}).encode(), s) for w, f, s in MISFITS] + FILES,
    ids=[m[0] for m in MISFITS] + [f[0] for f in FILES],
)
def test_a_config_that_does_not_fit_together_is_said_so(
    run_cli: Any, tmp_path: Path, command: str, what: str, text: bytes, says: str
) -> None:
    (tmp_path / "config.json").write_bytes(text)
    size = ["--tokens", "64"] if command == "step" else ["--step", "--budget", "1GiB"]
    code, out, err = run_cli(command, "--config", str(tmp_path), *size)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert says in err and "meta" not in err, err


def test_a_config_with_a_byte_order_mark_reads(run_cli: Any, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(SMALL).encode())
    code, out, err = run_cli("step", "--config", str(tmp_path), "--tokens", "64", "--json")
    assert code == 0, err
    assert json.loads(out)["peak_allocated_bytes"] > 0


# -- a baseline that is the run's own results: --update-baseline may rewrite the baseline,
# and so rewrote the run's results.json in the baseline's format


@pytest.mark.parametrize(
    "baseline", ["{run}/results.json", "{run}"], ids=["its results.json", "the run directory"]
)
def test_update_baseline_never_rewrites_the_runs_own_results(
    run_cli: Any, made_run: Path, here: Path, baseline: str
) -> None:
    import shutil

    run = here / "run"
    shutil.copytree(made_run, run)
    before = (run / "results.json").read_bytes()
    args = ["gate", str(run), "--baseline", baseline.format(run=run)]
    code, out, err = run_cli(*args, "--update-baseline", str(run / "results.json"))
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "an input of this command" in err
    assert (run / "results.json").read_bytes() == before
    # A baseline of its own is still rewritten.
    shutil.copy(run / "results.json", here / "base.json")
    base = str(here / "base.json")
    code, _, err = run_cli("gate", str(run), "--baseline", base, "--update-baseline", base)
    assert code == 0, err
