"""Hostile inputs, round 15 (flags, their combinations, user code, output paths): each row
is a variant of a defect class the pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_KERNEL, TINY_STEP, one_line, swept, user_module
from small_config import SMALL

RULES = '[tool.memprobe.gate]\nrules = [{kernel="*", max_peak="1TiB"}]\n'


def _snapshot(made_run: Path) -> str:
    return str(next((made_run / "snapshots").glob("*.pickle")))


def _config(here: Path) -> str:
    (here / "config.json").write_text(json.dumps(SMALL))
    return str(here / "config.json")


# -- a file output spelled as a folder (`--junit-xml reports/`): typer's Path drops the
# slash, so the file was written under the folder's own name, a file `reports` where a
# folder was meant (report's --out, which takes either, already said "no such folder")

FILE_OUTPUTS = [
    (["gate", "{run}", "--config", "g.toml", "--junit-xml", "{out}"], "--junit-xml"),
    (["gate", "{run}", "--config", "g.toml", "--update-baseline", "{out}"], "--update-baseline"),
    (["attribute", "{snap}", "--html", "{out}"], "--html"),
    (["profile", "{step}", "--out", "{out}"], "--out"),
    (["profile", "{step}", "--html", "{out}"], "--html"),
    (["step", "--config", "{config}", "--tokens", "8", "--out", "{out}"], "--out"),
]


def _args(args: list[str], here: Path, made_run: Path, out: str) -> list[str]:
    step = f"{user_module(here, 'r15_step', TINY_STEP)}:step" if "{step}" in args else ""
    config = _config(here) if "{config}" in args else ""
    (here / "g.toml").write_text(RULES)
    values = {"run": str(made_run), "snap": _snapshot(made_run), "step": step,
              "config": config, "out": out}  # fmt: skip
    return [a.format(**values) for a in args]


@pytest.mark.parametrize("out", ["reports/", "reports/.", "./reports//", "reports/sub/"])
@pytest.mark.parametrize(
    ("args", "flag"), FILE_OUTPUTS, ids=[" ".join(a[:1] + a[-2:-1]) for a, _ in FILE_OUTPUTS]
)
def test_a_file_output_spelled_as_a_folder_is_refused(
    run_cli: Any, here: Path, made_run: Path, args: list[str], flag: str, out: str
) -> None:  # fmt: skip
    err = one_line(*run_cli(*_args(args, here, made_run, out)))
    assert f"'{out}' names a folder, and {flag} writes a file" in err, err
    assert f"e.g. {flag} {out}" in err
    assert not (here / "reports").exists()


@pytest.mark.parametrize(
    ("args", "flag"), FILE_OUTPUTS, ids=[" ".join(a[:1] + a[-2:-1]) for a, _ in FILE_OUTPUTS]
)
def test_a_file_output_inside_a_folder_is_written(
    run_cli: Any, here: Path, made_run: Path, args: list[str], flag: str
) -> None:  # fmt: skip
    (here / "reports").mkdir()
    code, _, err = run_cli(*_args(args, here, made_run, "reports/made"))
    assert code == 0, err
    assert (here / "reports" / "made").is_file()


@pytest.mark.parametrize(
    "args",
    [
        [
            "sweep",
            "--tokens",
            "64",
            "--vocab",
            "128",
            "--no-ladder",
            "--kernel",
            "unchunked",
            "-q",
            "--no-verify",
            "--no-report",
            "--out",
            "reports/",
        ],
        [
            "plan",
            "--vocab",
            "256",
            "--budget",
            "1GiB",
            "--kernel",
            "unchunked",
            "--no-reserved",
            "--out",
            "reports/",
        ],
    ],  # fmt: skip
    ids=["sweep --out", "plan --out"],
)
def test_a_folder_output_may_still_end_in_a_slash(
    run_cli: Any, here: Path, args: list[str]
) -> None:
    code, _, err = run_cli(*args)
    assert code == 0, err
    assert (here / "reports").is_dir()


# -- a Triton peer kernel where memprobe only simulates (step and plan --step run on meta,
# --what-if simulates the loss it swaps in): the step "failed on meta in its forward phase"
# and the one line said "measure it on a GPU (--device cuda)" and "try --device cpu",
# flags step has not; --what-if said to run a meta sweep "to see it" (the sweep skips it)

PEER_COMMANDS = {
    "step": ["step", "--config", "{config}", "--tokens", "8", "--kernel", "{kernel}"],
    "plan --step": [
        "plan",
        "--step",
        "--config",
        "{config}",
        "--budget",
        "1GiB",
        "--no-reserved",
        "--kernel",
        "{kernel}",
    ],  # fmt: skip
}


@pytest.mark.parametrize(
    "kernel", ["liger_cross_entropy", "liger_fused_linear_ce", "cce_linear_ce"]
)
@pytest.mark.parametrize("command", sorted(PEER_COMMANDS))
def test_a_triton_kernel_in_a_simulated_step_is_refused_for_what_it_is(
    run_cli: Any, here: Path, command: str, kernel: str
) -> None:
    args = [a.format(config=_config(here), kernel=kernel) for a in PEER_COMMANDS[command]]
    err = one_line(*run_cli(*args))
    assert f"{kernel} is a Triton kernel: its memory cannot be simulated on meta" in err, err
    assert "--device cpu" not in err and "failed on meta" not in err
    assert "memprobe profile pkg.mod:step --device cuda" in err


def test_a_what_if_with_a_triton_kernel_is_refused_for_what_it_is(
    run_cli: Any, made_run: Path
) -> None:
    err = one_line(*run_cli("attribute", _snapshot(made_run), "--what-if", "liger_cross_entropy"))
    assert "liger_cross_entropy is a Triton kernel: its memory cannot be simulated" in err, err
    assert (
        "to see it" not in err
        and "memprobe sweep --device cuda --kernel liger_cross_entropy" in err
    )


def test_a_simulated_step_with_a_kernel_memprobe_simulates_still_runs(
    run_cli: Any, here: Path
) -> None:
    code, out, err = run_cli("step", "--config", _config(here), "--tokens", "8", "--kernel",
                             "torch_linear_ce")  # fmt: skip
    assert code == 0, err
    assert "kernel torch_linear_ce" in out


# -- --tokens/--batch that make fewer tokens than the snapshot's loss blocks have rows:
# believed, attribute printed "logits [B=5, S=3, V=128]; confidence given" beside the
# label's own [1, 64, 128], counted the logits as backward temporaries, and --what-if
# blamed the loss ("no loss step with [N, V] blocks ... found (a fused loss ...)")

# On memprobe's own snapshot the run's record gives B and S exactly: sizes that
# contradict it are refused by it (a user's snapshot without a record gets the line
# above, tests/attribute/test_what_if.py::test_fewer_tokens_than_the_loss_rows).
FEWER = [["--tokens", "3", "--batch", "5"], ["--tokens", "63"],
         ["--tokens", "8", "--batch", "7"], ["--batch", "1", "--tokens", "1"],
         ["--tokens", "64", "--batch", "2"], ["--tokens", "128"], ["--batch", "3"]]  # fmt: skip


@pytest.mark.parametrize("what_if", [[], ["--what-if", "local_chunked"]], ids=["read", "what-if"])
@pytest.mark.parametrize("sizes", FEWER, ids=[" ".join(s) for s in FEWER])
def test_sizes_that_contradict_the_record_are_refused(
    run_cli: Any, made_run: Path, sizes: list[str], what_if: list[str]
) -> None:
    err = one_line(*run_cli("attribute", _snapshot(made_run), *sizes, *what_if))
    assert "this snapshot's case" in err and "memprobe recorded B=1, S=64" in err, err
    assert "no loss step" not in err and "fused" not in err


@pytest.mark.parametrize(
    ("sizes", "shapes"),
    [
        (["--tokens", "64"], "logits [B=1, S=64, V=128]"),
        (["--tokens", "32", "--batch", "2"], "logits [B=2, S=32, V=128]"),
        (["--batch", "4"], "logits [B=4, S=16, V=128]"),
        (["--tokens", "32"], "logits [B=2, S=32, V=128]"),
        ([], "logits [B=1, S=64, V=128]"),
    ],
)
def test_sizes_that_hold_the_loss_rows_are_still_read(
    run_cli: Any, made_run: Path, sizes: list[str], shapes: str
) -> None:
    code, out, err = run_cli("attribute", _snapshot(made_run), *sizes)
    assert code == 0, err
    assert shapes in out


# ... and sizes with which --what-if finds no loss step while without them it finds one:
# the line blamed the loss ("no loss step with [N, V] blocks ... (a fused loss, or one
# the trace only partly holds)") for a --vocab that was not the snapshot's

HIDING = [["--vocab", "256"], ["--vocab", "1000"], ["--vocab", "64"]]


@pytest.mark.parametrize("sizes", HIDING, ids=[" ".join(s) for s in HIDING])
def test_sizes_that_hide_the_loss_step_are_named(
    run_cli: Any, made_run: Path, sizes: list[str]
) -> None:
    err = one_line(*run_cli("attribute", _snapshot(made_run), *sizes, "--what-if", "local_chunked"))
    # Round 27: a --vocab against memprobe's own record of the case is refused before
    # --what-if looks for the loss step, naming the flag and the recorded V.
    said = f"--vocab {int(sizes[1]):,}, but this snapshot's case has V=128 (memprobe recorded it)"
    assert said in err and "a fused loss" not in err, err


def test_a_what_if_at_the_snapshots_own_sizes_still_predicts(run_cli: Any, made_run: Path) -> None:
    code, out, err = run_cli("attribute", _snapshot(made_run), "--vocab", "128", "--tokens", "64",
                             "--batch", "1", "--what-if", "local_chunked")  # fmt: skip
    assert code == 0, err
    assert "local_chunked" in out


# -- gate flags that do nothing in the gate asked for: `gate RUN --out DIR` (--out is the
# gate's own sweep's run directory) and --max-regression with no baseline passed in
# silence, the gate's verdict as if they had been applied


@pytest.fixture
def gated(here: Path, made_run: Path) -> Path:
    (here / "g.toml").write_text(RULES)
    return Path(shutil.copytree(made_run, here / "run"))


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--out", "kept"], "--out kept is the run directory of the gate's own sweep"),
        (["--out", "run"], "--out run is the run directory of the gate's own sweep"),
        (["--max-regression", "5"], "--max-regression 5 is growth allowed over a baseline"),
        (["--max-regression", "0"], "--max-regression 0 is growth allowed over a baseline"),
        (["--max-regression", "2.5", "--update-baseline", "b.json"], "--max-regression 2.5 is"),
    ],
)
def test_a_gate_flag_that_would_do_nothing_is_refused(
    run_cli: Any, here: Path, gated: Path, flags: list[str], said: str
) -> None:
    err = one_line(*run_cli("gate", "run", "--config", "g.toml", *flags))
    assert said in err, err
    assert not (here / "kept").exists() and not (here / "b.json").exists()


@pytest.mark.parametrize(
    ("flags", "config"),
    [
        (["--baseline", "base", "--max-regression", "5"], ""),
        (["--max-regression", "5"], 'baseline = "base/results.json"\n'),
        ([], "max_regression = 5\n"),  # the config's own allowance, with no baseline
    ],
    ids=["--baseline", "baseline in the config", "max_regression in the config"],
)
def test_a_regression_allowance_with_a_baseline_is_still_read(
    run_cli: Any, here: Path, gated: Path, flags: list[str], config: str
) -> None:
    (here / "g.toml").write_text(RULES + config)
    shutil.copytree(gated, here / "base")  # the gated run as its own baseline is refused
    code, out, err = run_cli("gate", "run", "--config", "g.toml", *flags)
    assert code == 0, err


def test_a_negative_allowance_without_a_baseline_still_says_what_it_is(
    run_cli: Any, gated: Path
) -> None:
    err = one_line(*run_cli("gate", "run", "--config", "g.toml", "--max-regression", "-3"))
    assert "'-3' is not a percentage of zero or more" in err


# -- signal handlers and timers user code leaves: a kernel module that ignored SIGINT as it
# was imported (a library's graceful shutdown) kept a ten-case sweep from being stopped by
# Ctrl-C (it ran to its end and exited 0); SIGTERM is torchrun's stop, SIGPIPE a reader
# gone, SIGCHLD what a wait needs; an alarm a kernel left pending (signal.alarm(1) as it
# returned) ended the sweep a second later: "Alarm clock", exit 142, no report, no word

SIGNALS = {
    "SIGINT ignored": ("SIGINT", "signal.SIG_IGN"),
    "SIGTERM caught": ("SIGTERM", "lambda *a: None"),
    "SIGPIPE default": ("SIGPIPE", "signal.SIG_DFL"),
    "SIGCHLD ignored": ("SIGCHLD", "signal.SIG_IGN"),
    "SIGHUP ignored": ("SIGHUP", "signal.SIG_IGN"),
    "SIGALRM caught": ("SIGALRM", "lambda *a: None"),
}
TIMERS = {
    "alarm": "signal.alarm(100)",
    "real timer": "signal.setitimer(signal.ITIMER_REAL, 100)",
    "virtual timer": "signal.setitimer(signal.ITIMER_VIRTUAL, 100)",
    "profiling timer": "signal.setitimer(signal.ITIMER_PROF, 100, 100)",
}
ITIMERS = ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")


@pytest.fixture
def handlers() -> Any:
    """The test process's own handlers, put back (and timers stopped) whatever the test
    leaves."""
    import signal

    names = {name for name, _ in SIGNALS.values()}
    saved = {name: signal.getsignal(getattr(signal, name)) for name in names}
    yield saved
    for timer in ITIMERS:
        signal.setitimer(getattr(signal, timer), 0)
    for name, handler in saved.items():
        signal.signal(getattr(signal, name), handler)


def _doing(where: str, statement: str) -> str:
    """A module whose step and kernel are memprobe's tiny ones, running ``statement`` at
    import or as the call returns."""
    body = "import signal\n" + TINY_STEP + TINY_KERNEL.replace("from memprobe", "\nfrom memprobe")
    if where == "import":
        return body + statement + "\n"
    body = body.replace(".backward()\n", f".backward()\n    {statement}\n")
    return body.replace(
        "    return get_kernel('unchunked')(logits, targets)\n",
        f"    out = get_kernel('unchunked')(logits, targets)\n    {statement}\n    return out\n",
    )


def _running(command: str, module: str, made_run: Path) -> list[str]:
    return {
        "profile": ["profile", f"{module}:step"],
        "sweep": ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel",
                  f"{module}:k", "-q", "--no-verify", "--no-report", "--out", "run"],
        "attribute --what-if": ["attribute", _snapshot(made_run), "--what-if", f"{module}:k"],
        "plan": ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", f"{module}:k",
                 "--no-reserved"],
    }[command]  # fmt: skip


COMMANDS = ["profile", "sweep", "attribute --what-if", "plan"]


# The six signals go through one guard: all six replaced at once, each checked.
@pytest.mark.parametrize("where", ["import", "call"])
@pytest.mark.parametrize("command", COMMANDS)
def test_signal_handlers_user_code_replaces_are_put_back(
    run_cli: Any, here: Path, made_run: Path, handlers: dict[str, Any], command: str, where: str
) -> None:
    import signal

    statement = "; ".join(f"signal.signal(signal.{name}, {how})" for name, how in SIGNALS.values())
    module = user_module(here, "r15_signals", _doing(where, statement))
    code, _, err = run_cli(*_running(command, module, made_run))
    assert code == 0, err
    left = [
        n
        for n, (name, _) in SIGNALS.items()
        if signal.getsignal(getattr(signal, name)) != handlers[name]
    ]
    assert not left, left


# The timers go through one guard: two at once (alarm() and ITIMER_REAL are one timer).
@pytest.mark.parametrize("where", ["import", "call"])
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("timers", [("alarm", "virtual timer"), ("real timer", "profiling timer")])
def test_a_timer_user_code_leaves_running_is_stopped(
    run_cli: Any, here: Path, made_run: Path, handlers: dict[str, Any],
    command: str, where: str, timers: tuple[str, str],
) -> None:  # fmt: skip
    import signal

    module = user_module(here, "r15_timers", _doing(where, "; ".join(TIMERS[t] for t in timers)))
    code, _, err = run_cli(*_running(command, module, made_run))
    assert code == 0, err
    assert all(signal.getitimer(getattr(signal, t)) == (0.0, 0.0) for t in ITIMERS)


def test_a_timer_running_before_the_user_code_is_left_running(
    run_cli: Any, here: Path, handlers: dict[str, Any]
) -> None:
    import signal

    signal.setitimer(signal.ITIMER_REAL, 300)  # a harness's own timeout
    code, _, err = run_cli("profile", f"{user_module(here, 'r15_timed', TINY_STEP)}:step")
    assert code == 0, err
    assert signal.getitimer(signal.ITIMER_REAL)[0] > 0


def test_a_handler_user_code_puts_back_itself_stays(
    run_cli: Any, here: Path, handlers: dict[str, Any]
) -> None:
    import signal

    body = TINY_STEP.replace(
        "def step(device):\n",
        "import signal\ndef step(device):\n"
        "    old = signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "    signal.signal(signal.SIGINT, old)\n",
    )
    code, _, err = run_cli("profile", f"{user_module(here, 'r15_polite', body)}:step")
    assert code == 0, err
    assert signal.getsignal(signal.SIGINT) == handlers["SIGINT"]


# -- plan --from-run DIR --chunk-size N: "compare sizes with --chunk-size a,b,c (and their
# measured times with --from-run DIR)", asking for the flag the user had given


@pytest.fixture(scope="module")
def timed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return swept(
        tmp_path_factory.mktemp("timed") / "run",
        *("--tokens", "64", "--vocab", "256", "--no-ladder", "--kernel", "local_chunked"),
        *("--chunk-size", "16,32", "--device", "cpu", "-q", "--no-verify", "--no-report"),
    )


@pytest.mark.parametrize(
    ("flags", "asks"),
    [
        (["--from-run", "{run}", "--chunk-size", "16"], False),
        (["--from-run", "{run}/results.json", "--chunk-size", "32"], False),
        (["--chunk-size", "16"], True),
        ([], True),
    ],
    ids=["--from-run", "--from-run results.json", "no --from-run", "the default size"],
)
def test_a_single_chunk_size_line_asks_for_times_only_without_them(
    run_cli: Any, timed_run: Path, flags: list[str], asks: bool
) -> None:
    args = [f.format(run=timed_run) for f in flags]
    code, out, err = run_cli("plan", "--vocab", "256", "--budget", "1GiB", "--kernel",
                             "local_chunked", "--no-reserved", *args)  # fmt: skip
    assert code == 0, err
    assert "compare sizes with --chunk-size a,b,c" in out
    assert ("measured times with --from-run DIR" in out) == asks, out
