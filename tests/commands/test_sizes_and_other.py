"""``sweep --budget`` takes ``--other`` as ``plan`` does, and a memory size typed without a
unit that is implausibly small (``--other 58``: 58 bytes) is warned about on stderr."""

from __future__ import annotations

import pytest

from memprobe.commands.flags import warn_on_size

SWEEP = ["sweep", "--no-report",
         "--tokens", "1024", "--vocab", "4096", "--kernel", "unchunked,local_chunked",
         "--chunk-size", "256", "--device", "meta", "--no-verify"]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "warned"),
    [
        ("58", "--other 58 has no unit, so it is 58 B; for gibibytes write 58GiB"),
        ("80", "so it is 80 B"),
        (" 1_000 ", "so it is 1,000 B; for gibibytes write 1_000GiB"),
        ("1,024", "so it is 1.00 KiB"),
        ("1.5", None),  # no whole number of bytes: the command's error (not read as 1 B)
        ("1048575", "1,024.00 KiB"),  # just under 1 MiB
        ("1048576", None),  # 1 MiB: plausible as bytes
        ("0", None),  # nothing held: the default
        ("58GiB", None),
        ("58 b", None),  # a unit, however small, was asked for
        ("lots", None),  # not a size: the command's error, not a warning
        ("1" * 400, None),  # too large to be a size: the command's error too
        (None, None),
    ],
)
def test_unitless_small_sizes_warn(capsys, text, warned):
    warn_on_size(text, "--other")
    err = capsys.readouterr().err
    if warned is None:
        assert err == ""
    else:
        assert err.startswith("memprobe: warning: ") and warned in err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (["plan", "--vocab", "2048", "--kernel", "unchunked", "--no-reserved", "--budget", "80MiB"],
         ["--other", "58"]),
        (["plan", "--vocab", "2048", "--kernel", "unchunked", "--no-reserved", "--budget", "80"],
         []),
    ],
)  # fmt: skip
def test_plan_warns_and_still_runs(run_cli, command, flag):
    code, out, err = run_cli(*command, *flag)
    assert "has no unit" in err
    assert code == 0 or "nothing fits" in out or code == 2


@pytest.mark.parametrize(
    ("budget", "other", "limit", "fits"),
    [
        ("80MiB", "50MiB", "30.00 MiB", ["no", "yes"]),  # unchunked 56 MiB, local 20.01 MiB
        ("80MiB", "79MiB", "1.00 MiB", ["no", "no"]),
    ],
)
def test_sweep_budget_takes_other(run_cli, tmp_path, budget, other, limit, fits):
    code, out, err = run_cli(*SWEEP, "--out", str(tmp_path / "r"), "--budget", budget,
                             "--other", other)  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    assert f"budget {budget[:2]}.00 MiB - other {other[:2]}.00 MiB = {limit} for the " in out
    rows = [line.split() for line in lines if line.startswith(("unchunked ", "local_chunked "))]
    assert [r[-1] for r in rows] == fits
    assert f"Fit the {limit} budget" in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--other", "5GiB"], "--other needs --budget"),
        (["--budget", "1GiB", "--other", "2GiB"], "is more than --budget"),
        (["--budget", "1GiB", "--other", "1GiB"], "leaves nothing of --budget"),
        (["--budget", "1GiB", "--other", "lots"], "--other 'lots' is not a size"),
    ],
)
def test_sweep_other_mistakes_are_one_line(run_cli, tmp_path, args, says):
    code, out, err = run_cli(*SWEEP, "--out", str(tmp_path / "r"), *args)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()  # refused before anything ran


@pytest.mark.parametrize(
    ("text", "flag", "warned"),
    [
        ("80GB", "--budget", "--budget 80GB is 74.51 GiB (GB counts powers of ten)"),
        ("80 gb", "--budget", "a GPU sold as 80GB holds 80GiB"),
        ("1.5TB", "--budget", "TB counts powers of ten"),
        ("80GiB", "--budget", None),
        ("11000MB", "--other", None),  # only the card's size is sold in decimal units
        ("80GB", "--other", None),
    ],
)
def test_a_decimal_budget_says_what_it_is(capsys, text, flag, warned):
    warn_on_size(text, flag)
    err = capsys.readouterr().err
    if warned is None:
        assert err == ""
    else:
        assert err.startswith("memprobe: warning: ") and warned in err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "--vocab", "2048", "--budget", "80", "GiB"],
        ["sweep", "--tokens", "64", "--vocab", "128", "--budget", "8", "MiB"],
        ["plan", "--vocab", "2048", "--budget", "8GiB", "--other", "1", "GB"],
    ],
)
def test_a_size_split_by_a_space_says_how_to_write_it(run_cli, args):
    code, _, err = run_cli(*args)
    assert code == 2
    assert "write a size without a space, e.g. --budget 80GiB" in err
    assert len(err.strip().splitlines()) == 1


HELP_COMMANDS = ("plan", "step", "sweep", "attribute", "gate")
# Each command's --help in turn, in one fresh process (one torch import, not five).
_HELP_OFF_A_TERMINAL = """
import sys
from memprobe import cli
for command in sys.argv[1:]:
    print("=== " + command, flush=True)
    sys.argv = ["memprobe", command, "--help"]
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code, (command, exc.code)
"""


def test_help_off_a_terminal_never_cuts_an_option_name():
    """Help piped or captured, with no COLUMNS set: as a fresh process sees it."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run(
        [sys.executable, "-c", _HELP_OFF_A_TERMINAL, *HELP_COMMANDS],
        capture_output=True, text=True, env=env, check=True,
    ).stdout  # fmt: skip
    pages = dict(page.split("\n", 1) for page in out.split("=== ")[1:])
    assert sorted(pages) == sorted(HELP_COMMANDS)
    for command, page in pages.items():
        assert "Usage: memprobe " + command in page
        assert "…" not in page, command


USAGES = {
    "": "memprobe [OPTIONS] COMMAND [ARGS]...",
    "attribute": "memprobe attribute [OPTIONS] SNAPSHOT",
    "diff": "memprobe diff [OPTIONS] A B",
    "gate": "memprobe gate [OPTIONS] [RESULTS]",
    "profile": "memprobe profile [OPTIONS] MODULE:FUNCTION",
    "report": "memprobe report [OPTIONS] RUN_DIR",
    "kernels": "memprobe kernels [OPTIONS]",
    "plan": "memprobe plan [OPTIONS]",
    "step": "memprobe step [OPTIONS]",
    "sweep": "memprobe sweep [OPTIONS]",
}


@pytest.mark.parametrize("command", sorted(USAGES))
def test_help_names_arguments_as_click_did_and_flags_without_a_type(run_cli, command: str) -> None:
    """typer 0.29 wrote `{a} {b}` for arguments and `<bool>` beside every flag."""
    code, out, _ = run_cli(*([command] if command else []), "--help")
    assert code == 0
    usage = " ".join(out.split()).split("memprobe", 1)[1]
    assert usage.startswith(USAGES[command].removeprefix("memprobe"))
    assert "<bool>" not in out and "--help " in out


@pytest.mark.parametrize("command", sorted(c for c in USAGES if c))
def test_help_names_only_flags_the_command_takes(
    run_cli, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flag shared by two commands must not point at one only the other has (plan
    --step's --mp-param named --param-dtype, which only `memprobe step` takes)."""
    import re

    # Wide enough that no flag is wrapped at one of its hyphens (the width a test sees
    # differs between a terminal, a pipe and a pytest -n worker).
    monkeypatch.setenv("COLUMNS", "1000")

    import typer

    from memprobe import cli

    group = typer.main.get_command(cli.app)
    params = group.commands[command].params  # type: ignore[attr-defined]
    takes = {name for p in params for name in (*p.opts, *p.secondary_opts)} | {"--help"}
    code, out, _ = run_cli(command, "--help")
    assert code == 0
    named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", out))
    assert named - takes == set(), f"memprobe {command} --help names flags it lacks"
