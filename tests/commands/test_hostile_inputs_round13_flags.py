"""Hostile inputs, round 13 (flags, the process environment, user code): each row is a
variant of a defect class the pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import errno
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_KERNEL, TINY_STEP, one_line, user_module
from small_config import SMALL

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
         "--out", "run", "-q", "--no-verify"]  # fmt: skip
PLAN = ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", "unchunked", "--no-reserved"]


def _config(here: Path) -> str:
    (here / "config.json").write_text(json.dumps(SMALL))
    return str(here / "config.json")


def _snapshot(made_run: Path) -> str:
    return str(next((made_run / "snapshots").glob("*.pickle")))


# -- standard output to a file at the size limit (`ulimit -f`, EFBIG): a traceback, where
# a full device (ENOSPC) is one line


class _AtSizeLimit(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(errno.EFBIG, "File too large")


@pytest.mark.parametrize(
    "args",
    [
        ["kernels"],
        [*PLAN, "--json"],
        ["gate", "{run}", "--config", "g.toml"],
        ["diff", "{s}", "{s}"],
    ],
    ids=["kernels", "plan --json", "gate", "diff"],
)
def test_standard_output_at_the_file_size_limit_is_one_line(
    here: Path, made_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any, args: list[str]
) -> None:
    from memprobe import cli

    (here / "g.toml").write_text("[tool.memprobe.gate]\nrules = [{kernel='*', max_peak='1TiB'}]\n")
    argv = [a.format(run=made_run, s=_snapshot(made_run)) for a in args]
    monkeypatch.setattr(sys, "argv", ["memprobe", *argv])
    monkeypatch.setattr(sys, "stdout", _AtSizeLimit())
    with pytest.raises(SystemExit) as leaving:
        cli.main()
    err = capsys.readouterr().err
    assert leaving.value.code == 2 and err.endswith("cannot write the output: File too large\n")
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err  # plan: progress


# -- no usable temporary directory (TMPDIR gone or unwritable and /tmp read-only, `ulimit
# -f 0`): torch's first autograd op imports torch._dynamo, which asks tempfile for one; the
# one line blamed the kernel ("unchunked failed in the meta simulation ... run memprobe
# sweep") or meta ("the step failed on meta ... try --device cpu")


@pytest.fixture
def no_temp_dir(here: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tempfile finding no directory to write to, as with every candidate read-only."""
    gone = here / "gone"
    monkeypatch.setattr(tempfile, "tempdir", None)  # not the one found before
    monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: [str(gone)])
    with pytest.raises(FileNotFoundError):
        tempfile.gettempdir()
    return gone


@pytest.mark.parametrize("tmpdir", [None, "/nonexistent/tmp"], ids=["unset", "set"])
@pytest.mark.parametrize(
    "command", ["sweep", "plan", "plan --step", "profile", "step", "attribute --what-if"]
)
def test_no_temporary_directory_is_said_so(
    run_cli: Any, here: Path, made_run: Path, no_temp_dir: Path,
    monkeypatch: pytest.MonkeyPatch, command: str, tmpdir: str | None,
) -> None:  # fmt: skip
    if tmpdir is None:
        monkeypatch.delenv("TMPDIR", raising=False)
    else:
        monkeypatch.setenv("TMPDIR", tmpdir)
    args = {
        "sweep": SWEEP,
        "plan": PLAN,
        "plan --step": ["plan", "--step", "--config", _config(here), "--budget", "1GiB"],
        "profile": ["profile", f"{user_module(here, 'r13_tmp_step', TINY_STEP)}:step"],
        "step": ["step", "--config", _config(here), "--tokens", "64"],
        "attribute --what-if": [
            "attribute",
            _snapshot(made_run),
            "--what-if",
            f"{user_module(here, 'r13_tmp_kernel', TINY_KERNEL)}:k",
        ],
    }[command]
    err = one_line(*run_cli(*args))
    assert "no usable temporary directory, which torch needs to start" in err, err
    assert ("TMPDIR='/nonexistent/tmp'" in err) == (tmpdir is not None)
    assert "set TMPDIR to a directory you can write to" in err
    assert "meta" not in err and not (here / "run").exists()


NO_TORCH = [["gate", "{run}", "--config", "g.toml"], ["kernels"], ["attribute", "{s}"],
            ["report", "{run}", "--out", "r.html"]]  # fmt: skip


@pytest.mark.parametrize("args", NO_TORCH, ids=[a[0] for a in NO_TORCH])
def test_commands_that_run_no_torch_need_no_temporary_directory(
    run_cli: Any, here: Path, made_run: Path, no_temp_dir: Path, args: list[str]
) -> None:
    (here / "g.toml").write_text("[tool.memprobe.gate]\nrules = [{kernel='*', max_peak='1TiB'}]\n")
    code, out, err = run_cli(*[a.format(run=made_run, s=_snapshot(made_run)) for a in args])
    assert code == 0 and out, err


# -- MASTER_ADDR naming no host (a typo, a blank, a label past 63 characters): torch's store
# retried it for its whole timeout (5 minutes), a c10d warning on stderr every few seconds,
# rank 0 included

TORCHRUN = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_PORT": "29511"}
NO_HOSTS = ["nonexistent.invalid", " ", "a" * 70, "höst.invalid", "127.0.0.1 "]


@pytest.mark.parametrize("addr", NO_HOSTS, ids=["typo", "blank", "long label", "unicode", "space"])
@pytest.mark.parametrize(
    "args",
    [
        ["--device", "meta", "--kernel", "local_chunked", "--shard"],
        ["--device", "cpu", "--kernel", "chunked_distributed", "--tp", "2"],
    ],
    ids=["--shard", "--tp 2"],
)
def test_a_master_addr_that_names_no_host_is_one_line_at_once(
    run_cli: Any, here: Path, monkeypatch: pytest.MonkeyPatch, addr: str, args: list[str]
) -> None:
    import torch.distributed as dist

    def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("torch was asked to reach it")

    for name, value in {**TORCHRUN, "MASTER_ADDR": addr}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(dist, "rendezvous", never)
    monkeypatch.setattr(dist, "init_process_group", never)
    sweep = ["sweep", "--tokens", "64", "--vocab", "256", "--no-ladder", "-q", "--out", "o"]
    err = one_line(*run_cli(*sweep, *args))
    assert f"MASTER_ADDR={addr!r} in the environment names no host this machine can find" in err
    assert "unset WORLD_SIZE and RANK" in err and not (here / "o").exists()


@pytest.mark.parametrize("addr", ["127.0.0.1", "localhost", "::1"])
def test_a_master_addr_that_resolves_is_torchruns(
    monkeypatch: pytest.MonkeyPatch, addr: str
) -> None:
    from memprobe.measure.torchrun_env import torchrun_world

    for name, value in {**TORCHRUN, "MASTER_ADDR": addr}.items():
        monkeypatch.setenv(name, value)
    assert torchrun_world() == 2


# -- user code changing the environment memprobe reads after it: a step that set
# MPLBACKEND ended `profile --html` in matplotlib's traceback (its check ran before the
# step); a kernel that set WORLD_SIZE and RANK failed its sweep after the last case with
# "WORLD_SIZE='two' in the environment", a variable the user never set

SETS = "os.environ.update(WORLD_SIZE='two', RANK='x', MPLBACKEND='nonesuch', COLUMNS='0')"
ENV_NAMES = ("WORLD_SIZE", "RANK", "MPLBACKEND", "COLUMNS")


@pytest.mark.parametrize(
    "where",
    ["kernel call", "kernel import", "step call", "step import", "what-if kernel", "plan kernel"],
)
def test_user_code_leaves_the_environment_memprobe_reads_as_it_was(
    run_cli: Any, here: Path, made_run: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    kernel = "import os\n" + TINY_KERNEL
    if where.endswith("import"):
        kernel = f"import os\n{SETS}\n" + TINY_KERNEL
    else:
        kernel = kernel.replace("    return", f"    {SETS}\n    return")
    step = TINY_STEP.replace("import torch\n", "import os, torch\n")
    step = f"{step}{SETS}\n" if where == "step import" else f"{step}    {SETS}\n"
    k = f"{user_module(here, 'r13_env_k', kernel)}:k"
    args = {
        "kernel call": [*SWEEP, "--kernel", f"{k},unchunked", "--tokens", "64,128"],
        "kernel import": [*SWEEP, "--kernel", f"{k},unchunked"],
        "step call": ["profile", f"{user_module(here, 'r13_env_s', step)}:step", "--html", "p"],
        "step import": ["profile", f"{user_module(here, 'r13_env_s', step)}:step", "--html", "p"],
        "what-if kernel": ["attribute", _snapshot(made_run), "--what-if", k, "--html", "p"],
        "plan kernel": ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", k, "--out", "p"],
    }[where]
    code, out, err = run_cli(*args)
    assert code == 0 and out, err
    assert not [name for name in ENV_NAMES if name in os.environ]
    if where.startswith("kernel"):
        rows = json.loads((here / "run" / "results.json").read_text())["rows"]
        assert {r["status"] for r in rows} == {"ok"}


def test_the_user_codes_own_variables_stay_set(run_cli: Any, here: Path) -> None:
    step = TINY_STEP.replace("import torch\n", "import os, torch\n")
    step += "    os.environ['R13_MINE'] = os.environ.get('R13_MINE', '') + 'x'\n"
    name = user_module(here, "r13_env_own", step)
    try:
        code, _, err = run_cli("profile", f"{name}:step")
        assert code == 0 and os.environ["R13_MINE"] == "x", err
    finally:
        os.environ.pop("R13_MINE", None)


@pytest.mark.multiprocess
def test_a_matplotlib_backend_set_by_the_steps_import_is_not_memprobes(tmp_path: Path) -> None:
    """The real failure: matplotlib read MPLBACKEND as `--html` imported it to draw."""
    from launch import forked_torchrun

    step = TINY_STEP.replace("import torch\n", "import os, torch\nos.environ['MPLBACKEND'] = 'x'\n")
    (tmp_path / "r13_mpl.py").write_text(step)
    done = forked_torchrun(
        ["profile", "r13_mpl:step", "--html", "p.html"], cwd=tmp_path, nproc=0, timeout=60
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert (tmp_path / "p.html").is_file()


# -- a umask of 0o777 set by user code: memprobe's outputs were written mode 000, which the
# user could not open


def test_user_codes_umask_is_not_memprobes(run_cli: Any, here: Path) -> None:
    step = TINY_STEP.replace("import torch\n", "import os, torch\nos.umask(0o777)\n")
    step += "    os.umask(0o777)\n"
    name = user_module(here, "r13_umask", step)
    mask = os.umask(0o022)
    try:
        code, _, err = run_cli("profile", f"{name}:step", "--out", "p.pickle", "--html", "p.html")
        assert code == 0, err
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(mask)
    for made in ("p.pickle", "p.html"):
        assert (here / made).stat().st_mode & 0o666 == 0o644, made


# -- a module found in the current directory by the fallback import (the console script's
# sys.path holds no current directory): its print at import went into `--json`'s object,
# where the first import sends it to stderr


@pytest.mark.parametrize("command", ["profile", "plan"])
def test_a_module_imported_from_here_prints_to_stderr(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    body = "print('R13-AT-IMPORT')\n" + TINY_STEP + TINY_KERNEL
    name = user_module(tmp_path, f"r13_fallback_{command}", body)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    if command == "profile":
        args = ["profile", f"{name}:step", "--json"]
    else:
        args = ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", f"{name}:k", "--json"]
    code, out, err = run_cli(*args)
    assert code == 0 and "R13-AT-IMPORT" in err, err
    json.loads(out)  # JSON alone


# -- a recursion limit lowered by user code: every case after the kernel's failed,
# memprobe's own kernels too, and the report's template ended in a RecursionError


@pytest.mark.parametrize("where", ["kernel call", "kernel import"])
def test_user_codes_recursion_limit_is_not_memprobes(run_cli: Any, here: Path, where: str) -> None:
    limit = sys.getrecursionlimit()
    low = "sys.setrecursionlimit(len(inspect.stack()) + 25)"  # a little above where it is
    kernel = f"import inspect, sys\n{low}\n" + TINY_KERNEL
    if where == "kernel call":
        kernel = "import inspect, sys\n" + TINY_KERNEL.replace(
            "    return", f"    {low}\n    return"
        )
    k = f"{user_module(here, 'r13_depth', kernel)}:k"
    try:
        code, _, err = run_cli(*SWEEP, "--kernel", f"{k},unchunked,local_chunked")
        assert code == 0 and "Traceback" not in err, err
        assert sys.getrecursionlimit() == limit
    finally:
        sys.setrecursionlimit(limit)
    rows = json.loads((here / "run" / "results.json").read_text())["rows"]
    assert [r["status"] for r in rows[1:]] == ["ok", "ok"], [r["note"] for r in rows]
    assert (here / "run" / "report.html").is_file()


# -- COLUMNS of 0 (left by a tool that found no terminal) or a few columns: rich drew the
# help in that width, one blank line at 0 and a column of word pieces up to 20


@pytest.mark.parametrize("columns", ["0", "1", "5", "39", "", "abc", "-3", "٨٠"])
@pytest.mark.parametrize("command", ["sweep", "plan", ""])
def test_help_in_a_width_of_nothing_is_still_read(
    run_cli: Any, monkeypatch: pytest.MonkeyPatch, columns: str, command: str
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = run_cli(*([command] if command else []), "--help")
    assert code == 0
    assert "Usage:" in out and "--help" in out and "…" not in out, out
    assert max(len(line) for line in out.splitlines()) >= 80


def test_a_wide_columns_is_still_the_width(run_cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_cli("sweep", "--help")
    assert code == 0 and max(len(line) for line in out.splitlines()) == 200


# -- --case-timeout nan: typer's bound check read it as "should be less than or equal to
# 1000000", which NaN is not more than (since round 25 the value is echoed as typed)


@pytest.mark.parametrize(
    "value", ["nan", "-nan", "NaN", "inf", "1e300", "0", "-1", "1000001"]
)  # fmt: skip
def test_a_case_timeout_out_of_bounds_says_what_it_is(run_cli: Any, here: Path, value: str) -> None:
    err = one_line(*run_cli(*SWEEP, "--shard", "--case-timeout", value))
    assert f"--case-timeout {value!r} is not a number of seconds from 0.001 to 1,000,000" in err
    assert "less than or equal" not in err and not (here / "run").exists()


@pytest.mark.parametrize("value", ["0.001", "1000000", "600"])
def test_a_case_timeout_in_bounds_reaches_the_shard_check(run_cli: Any, value: str) -> None:
    err = one_line(*run_cli(*SWEEP, "--shard", "--case-timeout", value))
    assert "--shard shares the cases out across torchrun ranks" in err


# -- sys.path emptied by user code: what memprobe imported after it was not found; a
# sweep's run lost its snapshots and plots without a word, attribute --html ended in a
# ModuleNotFoundError traceback

CLEARS = "sys.path[:] = ['/nonexistent']"


@pytest.mark.parametrize("where", ["kernel call", "kernel import", "step import"])
def test_entries_user_code_takes_off_sys_path_are_put_back(
    run_cli: Any, here: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # this test's own, put back after
    before = list(sys.path)
    if where == "step import":
        body = TINY_STEP.replace("import torch\n", f"import sys, torch\n{CLEARS}\n")
        code, _, err = run_cli("profile", f"{user_module(here, 'r13_path_s', body)}:step")
    else:
        body = "import sys\n" + TINY_KERNEL
        if where == "kernel import":
            body = f"import sys\n{CLEARS}\n" + TINY_KERNEL
        else:
            body = body.replace("    return", f"    {CLEARS}\n    return")
        k = f"{user_module(here, 'r13_path_k', body)}:k"
        code, _, err = run_cli(*SWEEP, "--kernel", f"unchunked,{k},local_chunked")
        rows = json.loads((here / "run" / "results.json").read_text())["rows"]
        assert [r["status"] for r in rows] == ["ok"] * 3, [r["note"] for r in rows]
    assert code == 0, err
    assert set(before) <= set(sys.path) and "/nonexistent" in sys.path


@pytest.mark.multiprocess
def test_an_emptied_sys_path_does_not_stop_the_page(tmp_path: Path, made_run: Path) -> None:
    """The real failure: matplotlib, imported to draw after the kernel ran, not found."""
    from launch import forked_torchrun

    body = "import sys\n" + TINY_KERNEL.replace("    return", f"    {CLEARS}\n    return")
    (tmp_path / "r13_path_page.py").write_text(body)
    args = ["attribute", _snapshot(made_run), "--what-if", "r13_path_page:k", "--html", "a.html"]
    done = forked_torchrun(args, cwd=tmp_path, nproc=0, timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert (tmp_path / "a.html").is_file()


# -- a gate given a run's results.json (not its folder): the run's other files were no
# inputs, so `--update-baseline run/run.json` left a folder no longer a run (report and
# --resume refused it) and `--junit-xml run/report.html` replaced the run's page


@pytest.mark.parametrize(
    ("flag", "name"),
    [("--update-baseline", "run.json"), ("--junit-xml", "report.html"),
     ("--junit-xml", "snapshots/j.xml"), ("--update-baseline", "results.csv"),
     ("--junit-xml", "timeline.png")],
)  # fmt: skip
def test_a_gate_on_a_runs_results_file_replaces_none_of_the_run(
    run_cli: Any, made_run: Path, here: Path, flag: str, name: str
) -> None:
    import shutil

    run = here / "run"
    shutil.copytree(made_run, run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    (here / "g.toml").write_text("[tool.memprobe.gate]\nrules = [{kernel='*', max_peak='1TiB'}]\n")
    args = ["gate", str(run / "results.json"), "--config", "g.toml", flag, str(run / name)]
    err = one_line(*run_cli(*args))
    assert "an input of this command" in err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_results_file_outside_a_run_still_takes_outputs_beside_it(
    run_cli: Any, made_run: Path, here: Path
) -> None:
    (here / "results.json").write_bytes((made_run / "results.json").read_bytes())
    (here / "g.toml").write_text("[tool.memprobe.gate]\nrules = [{kernel='*', max_peak='1TiB'}]\n")
    code, _, err = run_cli("gate", "results.json", "--config", "g.toml", "--junit-xml", "j.xml")
    assert code == 0 and (here / "j.xml").is_file(), err


# -- an output naming the user kernel's own source file: `step --kernel mine:k --out
# mine.py` replaced the kernel's code with a pickle, `attribute --what-if mine:k --html
# mine.py` with the page (profile already guarded its step's file)


@pytest.mark.parametrize("command", ["step --out", "attribute --what-if --html"])
@pytest.mark.parametrize("named", ["{name}.py", "./{name}.py", "{here}/{name}.py"])
def test_an_output_never_replaces_the_kernels_source(
    run_cli: Any, here: Path, made_run: Path, command: str, named: str
) -> None:
    # A module of its own per case: one imported stays in sys.modules, its file the first's.
    stem = f"r13_src_{command.split()[0]}_{len(named)}"
    name = user_module(here, stem, TINY_KERNEL)
    target = named.format(name=name, here=here)
    args = {
        "step --out": ["step", "--config", _config(here), "--tokens", "64", "--kernel",
                       f"{name}:k", "--out", target],
        "attribute --what-if --html": ["attribute", _snapshot(made_run), "--what-if",
                                       f"{name}:k", "--html", target],
    }[command]  # fmt: skip
    err = one_line(*run_cli(*args))
    assert "an input of this command" in err
    assert (here / f"{name}.py").read_text() == TINY_KERNEL


@pytest.mark.parametrize("kernel", ["local_chunked", "user"])
def test_an_output_beside_the_kernel_is_written(
    run_cli: Any, here: Path, made_run: Path, kernel: str
) -> None:
    if kernel == "user":
        kernel = f"{user_module(here, 'r13_src_beside', TINY_KERNEL)}:k"
    args = ["attribute", _snapshot(made_run), "--what-if", kernel, "--html", "page.html"]
    code, _, err = run_cli(*args)
    assert code == 0 and (here / "page.html").is_file(), err
    args = ["step", "--config", _config(here), "--tokens", "64", "--kernel", kernel]
    code, _, err = run_cli(*args, "--out", "s.pickle")
    assert code == 0 and (here / "s.pickle").is_file(), err


# -- TERM=dumb on a terminal: rich took memprobe's width for a table printed whole only
# with a height, so the table was drawn in 80 columns and its numbers cut ("299,…")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("term", ["dumb", "unknown", "xterm-256color"])
@pytest.mark.parametrize("columns", [None, "40", "200"])
def test_a_table_on_any_terminal_is_printed_whole(
    monkeypatch: pytest.MonkeyPatch, term: str, columns: str | None
) -> None:
    from memprobe.render.console import show, table

    monkeypatch.setenv("TERM", term)
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    header = [f"column number {i}" for i in range(9)]
    row = [f"{10**12 + i:,}" for i in range(9)]
    stream = _Terminal()
    show([table(header, [row])], file=stream)
    text = stream.getvalue()
    assert "…" not in text and all(cell in text for cell in row), text
