"""Hostile inputs, round 32 (the command line of every command: options given without
their values, values that are options, repeated and contradictory options, numeric edge
values, and the hint each refusal ends with): each row is a variant of a defect class the
pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_STEP, one_line, user_module
from small_config import SMALL

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
         "--device", "meta", "--no-verify", "--no-report"]  # fmt: skip


# -- an option given without its value, followed by another option: click read the next
# option word as the value. `step --config c --tokens 64 --out --json` wrote its snapshot
# to a file named '--json' in the current directory (one `rm --json` cannot remove) and
# printed text, not the JSON asked for; `sweep --out --json` made a run directory of that
# name; `attribute S --html --json` a page; `sweep --kernel --tokens 64` said "unexpected
# extra argument (64)", of a 64 plainly given. A value that spells one of the command's
# own options is now refused, naming it.
TAKEN = {
    "step --out --json": (["step", "--config", "{config}", "--tokens", "8", "--out", "--json"],
                          "--out", "--json"),
    "sweep --out --json": ([*SWEEP, "--out", "--json"], "--out", "--json"),
    "sweep --kernel --tokens": (["sweep", "--kernel", "--tokens", "64"], "--kernel", "--tokens"),
    "sweep --tokens --no-ladder": (["sweep", "--tokens", "--no-ladder"], "--tokens", "--no-ladder"),
    "sweep --resume --help": (["sweep", "--resume", "--help"], "--resume", "--help"),
    "plan --budget --json": (["plan", "--vocab", "128", "--budget", "--json"], "--budget",
                             "--json"),
    "attribute --html --top=3": (["attribute", "s.pickle", "--html", "--top=3"], "--html",
                                 "--top=3"),
    "profile --html --json": (["profile", "m:step", "--html", "--json"], "--html", "--json"),
    "gate --junit-xml --baseline": (["gate", "run", "--junit-xml", "--baseline", "b.json"],
                                    "--junit-xml", "--baseline"),
    "report --out --budget": (["report", "run", "--out", "--budget", "1GiB"], "--out", "--budget"),
}  # fmt: skip


@pytest.mark.parametrize(("args", "flag", "taken"), TAKEN.values(), ids=TAKEN.keys())
def test_an_option_read_as_the_value_of_the_one_before_is_refused(
    run_cli: Any, here: Path, args: list[str], flag: str, taken: str
) -> None:
    (here / "config.json").write_text("{}")
    args = [a.replace("{config}", str(here / "config.json")) for a in args]
    err = one_line(*run_cli(*args))
    assert f"'{flag}'" in err and f"the next option, {taken}, was read as the value" in err
    assert list(here.iterdir()) == [here / "config.json"], "nothing written"


# ... while values that merely start with a dash are still the option's own: a negative
# number is judged as a number, and a path './--json' names a file of that name.
def test_a_value_that_is_no_option_is_still_a_value(run_cli: Any, here: Path) -> None:
    err = one_line(*run_cli(*SWEEP[:2], "-64", *SWEEP[3:]))
    assert "-64 must be positive" in err
    code, out, err = run_cli(*SWEEP, "-q", "--out", "./--json")
    assert code == 0, err
    assert (here / "--json" / "results.json").is_file()


# -- an option given last without its value (`plan --vocab 128 --budget`), or a value
# given to a flag (`sweep --json=1`): click raised these with no command attached, and the
# line's hint said "(see `memprobe --help`)", the root's page, which lists none of the
# command's options. The hint now names the command's own help.
MISSING = {
    "sweep --tokens": (["sweep", "--tokens"], "sweep"),
    "plan --budget": (["plan", "--vocab", "128", "--budget"], "plan"),
    "step --config": (["step", "--config"], "step"),
    "gate --max-regression": (["gate", "run", "--max-regression"], "gate"),
    "attribute --top": (["attribute", "s.pickle", "--top"], "attribute"),
    "diff --top": (["diff", "a", "b", "--top"], "diff"),
    "report --out": (["report", "run", "--out"], "report"),
    "sweep --json=1": (["sweep", "--json=1"], "sweep"),
    "sweep --no-report=yes": (["sweep", "--no-report=yes"], "sweep"),
    "profile --json=true": (["profile", "m:step", "--json=true"], "profile"),
}


@pytest.mark.parametrize(("args", "command"), MISSING.values(), ids=MISSING.keys())
def test_a_value_missing_or_given_to_a_flag_points_at_the_commands_help(
    run_cli: Any, args: list[str], command: str
) -> None:
    err = one_line(*run_cli(*args))
    assert f"memprobe {command} --help`)" in err, err


# -- PYTORCH_NO_CUDA_MEMORY_CACHING=1 in the environment (torch's switch that turns its
# caching allocator off): the cuda backend refused it, while on meta and cpu every command
# that models reserved memory went on with the caching allocator's figures, "reserved 2.00
# MiB (allocator model)" and a plan's reserved answer "with default settings", for a job
# whose allocator caches nothing. Where the settings come from the environment it is now
# refused; settings given with --alloc-conf, or a plan without its reserved answer, still
# run.
UNCACHED = {
    "sweep": [*SWEEP, "--out", "run"],
    "sweep on cpu": [*SWEEP[:-4], "--device", "cpu", "--no-verify", "--no-report", "--out", "run"],
    "step": ["step", "--config", "{config}", "--tokens", "8"],
    "plan": ["plan", "--vocab", "128", "--budget", "1MiB", "--kernel", "unchunked"],
    "profile": ["profile", "{step}", "--device", "meta"],
}


@pytest.mark.parametrize("value", ["1", "true", "2"])
@pytest.mark.parametrize("what", UNCACHED)
def test_an_uncached_allocator_in_the_environment_is_refused(
    run_cli: Any, here: Path, monkeypatch: pytest.MonkeyPatch, what: str, value: str
) -> None:
    (here / "config.json").write_text(json.dumps(SMALL))
    step = user_module(here, "s", TINY_STEP) + ":step"
    values = {"config": str(here / "config.json"), "step": step}
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", value)
    err = one_line(*run_cli(*[a.format(**values) for a in UNCACHED[what]]))
    assert f"PYTORCH_NO_CUDA_MEMORY_CACHING={value} in the environment" in err
    assert not (here / "run").exists()


# ... while "0" or "" leave caching on (as the cuda backend reads them), and settings given
# on the command line, or a plan on allocated bytes alone, model nothing of the environment.
KEPT = {
    "0": ("0", []),
    "empty": ("", []),
    "--alloc-conf": ("1", ["--alloc-conf", "expandable_segments:True"]),
    "--no-reserved": ("1", ["--no-reserved"]),
}


@pytest.mark.parametrize(("value", "flags"), KEPT.values(), ids=KEPT.keys())
def test_a_plan_runs_where_caching_is_on_or_not_modelled(
    run_cli: Any, monkeypatch: pytest.MonkeyPatch, value: str, flags: list[str]
) -> None:
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", value)
    code, out, err = run_cli(*UNCACHED["plan"], *flags)
    assert code == 0, err
    assert "583 tokens per GPU" in out, out


# -- per_process_memory_fraction below 1 (in --alloc-conf or PYTORCH_ALLOC_CONF) beside a
# budget: torch lets the process reserve only that share of the GPU, while every budget
# check judged the whole budget. `step --budget 3MiB --alloc-conf
# per_process_memory_fraction:0.5` said "fits (reserved 2.00 MiB)" of a job its allocator
# stops at 1.5 MiB (at a fraction of 0, at nothing); plan's reserved answer and sweep's
# `fits` alike. The share is now named as the budget to give.
FRACTION = {
    "step, flag": (["step", "--config", "{config}", "--tokens", "8", "--budget", "3MiB"], "0.5",
                   "flag", "1.50 MiB of the 3.00 MiB budget", "--budget 1572864B"),
    "step, zero": (["step", "--config", "{config}", "--tokens", "8", "--budget", "3MiB"], "0",
                   "flag", "0 B of the 3.00 MiB budget", "fits nothing"),
    "plan, flag": (["plan", "--vocab", "128", "--budget", "4MiB"], "0.25", "flag",
                   "1.00 MiB of the 4.00 MiB budget", "--budget 1048576B"),
    "plan --step": (["plan", "--step", "--config", "{config}", "--budget", "2MiB"], "0.5", "flag",
                    "1.00 MiB of the 2.00 MiB budget", "--budget 1048576B"),
    "plan, environment": (["plan", "--vocab", "128", "--budget", "4MiB"], "0.25", "env",
                          "(PYTORCH_ALLOC_CONF)", "--budget 1048576B"),
    "sweep, environment": ([*SWEEP, "--budget", "200KiB", "--out", "run"], "0.5", "env",
                           "100.00 KiB of the 200.00 KiB budget", "--budget 102400B"),
    "sweep, flag": ([*SWEEP, "--budget", "200KiB", "--out", "run"], "0.5", "flag",
                    "(--alloc-conf)", "--budget 102400B"),
}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "fraction", "where", "says", "hint"), FRACTION.values(), ids=FRACTION.keys()
)
def test_a_memory_fraction_beside_a_budget_names_the_share(
    run_cli: Any,
    here: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    fraction: str,
    where: str,
    says: str,
    hint: str,
) -> None:
    (here / "config.json").write_text(json.dumps(SMALL))
    setting = f"per_process_memory_fraction:{fraction}"
    if where == "env":
        monkeypatch.setenv("PYTORCH_ALLOC_CONF", setting)
    flags = ["--alloc-conf", setting] if where == "flag" else []
    err = one_line(*run_cli(*[a.format(config=here / "config.json") for a in args], *flags))
    assert f"per_process_memory_fraction:{fraction} " in err and says in err and hint in err
    assert not (here / "run").exists()


# ... while a fraction of 1, or a fraction with no budget to judge, still runs.
@pytest.mark.parametrize(
    "args",
    [["--budget", "3MiB", "--alloc-conf", "per_process_memory_fraction:1"],
     ["--alloc-conf", "per_process_memory_fraction:0.5"]],
    ids=["fraction 1", "no budget"],
)  # fmt: skip
def test_a_whole_fraction_or_no_budget_still_runs(
    run_cli: Any, here: Path, args: list[str]
) -> None:
    (here / "config.json").write_text(json.dumps(SMALL))
    code, out, err = run_cli("step", "--config", str(here / "config.json"), "--tokens", "8", *args)
    assert code == 0, err
    assert "peak allocated" in out
