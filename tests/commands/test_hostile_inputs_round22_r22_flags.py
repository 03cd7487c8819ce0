"""Hostile inputs, round 22 (the command line and user code: flags, their syntaxes, the
environment, a user's step or kernel named on the command line): each row is a variant of
a defect class the pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_KERNEL, TINY_STEP, one_line, user_module

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--device", "meta",
         "--no-verify", "--no-report", "--json"]  # fmt: skip


# -- a step or kernel named by its file's path, or with a dot where the colon goes: only
# `mine.py:step` got the spelling that works ("name the module, not its file: mine:step");
# `./mine.py:step`, `/abs/dir/mine.py:step`, `pkg/mine:step`, `mine.step` and `mine :step`
# were answered with the bare rule ("given as pkg.module:fn"), which the user believed
# they had followed. Each now names the import path it most likely meant.

SPELLINGS = {
    "a relative file": ("./{m}.py:{f}", "name the module, not its file: {m}:{f}"),
    "a file in a folder": ("pkg/{m}.py:{f}", "name the module, not its file: pkg.{m}:{f}"),
    "a folder without .py": ("pkg/sub/{m}:{f}", "name the module, not its file: pkg.sub.{m}:{f}"),
    "an absolute file": ("{here}/{m}.py:{f}",
        "run memprobe from {here} and name the module: {m}:{f}"),
    "a parent folder": ("../x/{m}.py:{f}", "run memprobe from ../x and name the module: {m}:{f}"),
    "a dot for the colon": ("{m}.{f}", "with ':', e.g. {m}:{f}"),
    "a blank before the colon": ("{m} :{f}", "write {m}:{f}"),
}  # fmt: skip


@pytest.mark.parametrize(("spelled", "advice"), SPELLINGS.values(), ids=list(SPELLINGS))
@pytest.mark.parametrize("role", ["step", "kernel"])
def test_a_file_path_for_an_import_path_gets_the_spelling_that_works(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str, spelled: str,
    advice: str,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    body, fn = (TINY_STEP, "step") if role == "step" else (TINY_KERNEL, "k")
    name = user_module(tmp_path, f"r22_spelled_{role}", body)
    given = spelled.format(m=name, f=fn, here=tmp_path)
    args = ["profile", given, "--device", "meta"] if role == "step" else [*SWEEP, "--kernel", given]
    err = one_line(*run_cli(*args))
    if role == "kernel" and ":" not in given:
        # No colon is a built-in's name to the kernel flag: "unknown kernel", and the guess.
        assert f"did you mean '{name}:{fn}'?" in err
    else:
        assert "is not an import path" in err
        assert advice.format(m=name, f=fn, here=tmp_path) in err


# ... while what reads as no import path at all keeps the rule itself.
@pytest.mark.parametrize("given", ["mine", "mine:", ":step", "mine:step:extra", "a-b:step"])
def test_no_guess_where_none_can_be_read(run_cli: Any, given: str) -> None:
    err = one_line(*run_cli("profile", given, "--device", "meta"))
    assert "given as pkg.module:fn" in err and "e.g." not in err and "write" not in err


# -- a path starting with '~' that the shell did not expand (quoted, or after a comma in
# --other-from's list): memprobe took it as written, so `sweep --out '~/runs'` made a
# folder named '~' in the current directory (one an `rm -rf ~` then meant to clear up) and
# `attribute '~/step.pickle'` said there was no such file. Each names the path it meant;
# `./~` still names a file or folder of that name.

TILDES = {
    "sweep --out": ["sweep", "--device", "meta", "--out", "~/r22_runs"],
    "profile --out": ["profile", "{step}", "--device", "meta", "--out", "~/r22_step.pickle"],
    "profile --html": ["profile", "{step}", "--device", "meta", "--html", "~/r22_page.html"],
    "attribute SNAPSHOT": ["attribute", "~/r22_step.pickle"],
    "diff's second file": ["diff", "a.pickle", "~/r22_b.pickle"],
    "gate --config": ["gate", "--config", "~/r22_gate.toml"],
    "plan --other-from, after a comma": ["plan", "--vocab", "128", "--budget", "1GiB",
                                          "--other-from", "a.pickle,~/r22_b.pickle"],
    "report --out": ["report", "run", "--out", "~/r22_page.html"],
}  # fmt: skip


@pytest.mark.parametrize("args", TILDES.values(), ids=list(TILDES))
def test_a_path_from_an_unexpanded_home_is_refused(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    step = user_module(tmp_path, "r22_tilde_step", TINY_STEP) + ":step"
    given = [a.format(step=step) for a in args]
    err = one_line(*run_cli(*given))
    assert "starts with '~'" in err and f"write {home}/r22_" in err
    assert not (tmp_path / "~").exists() and not home.exists()


def test_a_tilde_without_a_home_asks_for_the_whole_path(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    err = one_line(*run_cli("attribute", "~no_such_user_r22/step.pickle"))
    assert "give the folder in full" in err


# ... while ./~ names a path of that name, and a '~' inside a path is the path's own.
@pytest.mark.parametrize("out", ["./~/step.pickle", "a~b/step.pickle"])
def test_a_tilde_that_is_a_name_is_kept(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str
) -> None:
    monkeypatch.chdir(tmp_path)
    step = user_module(tmp_path, "r22_tilde_kept", TINY_STEP) + ":step"
    code, _, err = run_cli("profile", step, "--device", "meta", "--out", out)
    assert code == 0, err
    assert (tmp_path / out).is_file()


# -- a percentage written with its sign (`gate --max-regression 5%`, the flag's metavar is
# PCT): refused as "Input should be a valid number, unable to parse string as a number",
# words of the parsing library that name neither the flag's unit nor a spelling it takes.

PERCENTS = {"5%": 5.0, " 5 %": 5.0, "2.5%": 2.5, "0%": 0.0}


@pytest.mark.parametrize(("given", "allowed"), PERCENTS.items(), ids=list(PERCENTS))
def test_a_percentage_with_its_sign_is_that_percentage(given: str, allowed: float) -> None:
    from memprobe.commands.gate import _percent

    assert _percent(given) == allowed


@pytest.mark.parametrize("given", ["5%%", "five", "%", "5 percent"])
def test_what_is_no_percentage_says_so(run_cli: Any, given: str) -> None:
    err = one_line(*run_cli("gate", "run", "--max-regression", given))
    assert f"--max-regression {given!r} is not a percentage" in err and "for 5%" in err


def test_the_sign_reaches_the_gate(
    run_cli: Any, tmp_path: Path, made_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    monkeypatch.chdir(tmp_path)  # no project's pyproject.toml: the baseline is the only check
    base = tmp_path / "base"
    shutil.copytree(made_run, base)
    code, out, err = run_cli(
        "gate", str(made_run), "--baseline", str(base / "results.json"), "--max-regression", "5%"
    )
    assert code == 0 and "passed" in out, err
