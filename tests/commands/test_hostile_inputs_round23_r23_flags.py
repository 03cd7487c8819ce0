"""Hostile inputs, round 23 (the command line and the environment: output paths, and the
variables the gate writes through): each row is a variant of a defect class the pass
found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import json
import os
import xml.dom.minidom
from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_STEP, one_line, user_module

GATE_TOML = '[tool.memprobe.gate]\nrules = [{kernel="*", max_peak="1TiB"}]\n'
SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
         "--device", "meta", "--no-verify", "--no-report"]  # fmt: skip


def _snapshot(made_run: Path) -> str:
    return str(next((made_run / "snapshots").glob("*.pickle")))


# -- an output file named below a file that stands where one of its folders goes
# (`--out notes.txt/step.pickle`, a name typed one level too deep): the refusal was the
# words of whichever call met the file first, "File exists" (of a snapshot that does not
# exist) from profile, step, attribute and the gate's two outputs, "Not a directory" one
# level deeper, and `report --out` said the file "does not exist" (or "create it first").
# Each now names the file in the way.

UNDER_A_FILE = {
    "profile --out": ["profile", "{step}", "--device", "meta", "--out", "{o}.pickle"],
    "profile --html": ["profile", "{step}", "--device", "meta", "--html", "{o}.html"],
    "attribute --html": ["attribute", "{snap}", "--html", "{o}.html"],
    "gate --junit-xml": ["gate", "{run}", "--config", "g.toml", "--junit-xml", "{o}.xml"],
    "gate --update-baseline": ["gate", "{run}", "--config", "g.toml", "--update-baseline",
                               "{o}.json"],
    "report --out, a page": ["report", "{run}", "--out", "{o}.html"],
    "report --out, a folder": ["report", "{run}", "--out", "{o}/"],
}  # fmt: skip


@pytest.mark.parametrize("depth", ["notes.txt/out", "notes.txt/deeper/out"])
@pytest.mark.parametrize("what", UNDER_A_FILE)
def test_an_output_below_a_file_names_the_file(
    run_cli: Any, here: Path, made_run: Path, what: str, depth: str
) -> None:
    (here / "g.toml").write_text(GATE_TOML)
    (here / "notes.txt").write_text("mine\n")
    values = {"run": str(made_run), "snap": _snapshot(made_run), "o": depth,
              "step": user_module(here, "r23_step", TINY_STEP) + ":step"}  # fmt: skip
    line = one_line(*run_cli(*(a.format(**values) for a in UNDER_A_FILE[what])))
    assert "notes.txt is a file, not a folder" in line
    assert "File exists" not in line and "does not exist" not in line
    assert (here / "notes.txt").read_text() == "mine\n"


# ... while a missing folder on the way is still made, as before.
def test_an_output_in_a_missing_folder_is_still_written(run_cli: Any, here: Path) -> None:
    step = user_module(here, "r23_step_ok", TINY_STEP) + ":step"
    code, _, _ = run_cli("profile", step, "--device", "meta", "--out", "new/dir/s.pickle")
    assert code == 0 and (here / "new" / "dir" / "s.pickle").is_file()


# -- a run directory named by a link that leads to nothing (a loop of links, or a link
# to a folder not made yet): mkdir met the link, and `sweep --out` said the run "already
# exists and is not empty (continue it with --resume LINK)", a resume that cannot work.

DEAD_LINKS = {
    "a link to itself": lambda here: "loop",
    "a loop of two": lambda here: "loop2",
    "a link to a missing folder": lambda here: str(here / "nowhere" / "run"),
    "a link to a missing folder, relative": lambda here: "nowhere/run",
}


@pytest.mark.parametrize("what", DEAD_LINKS)
@pytest.mark.parametrize("command", ["sweep", "gate"])
def test_a_run_directory_that_is_a_dead_link_is_said_so(
    run_cli: Any, here: Path, what: str, command: str
) -> None:
    (here / "loop2").symlink_to("link")  # with "link" -> "loop2", a loop of two
    (here / "loop").symlink_to("loop")
    (here / "link").symlink_to(DEAD_LINKS[what](here))
    if command == "sweep":
        args = [*SWEEP, "--out", "link"]
    else:  # the gate's own sweep, from its config
        (here / "g.toml").write_text(
            '[tool.memprobe.sweep]\ntokens = [64]\nvocab = [128]\nkernel = ["unchunked"]\n'
            'device = "meta"\n' + GATE_TOML
        )
        args = ["gate", "--config", "g.toml", "--out", "link"]
    line = one_line(*run_cli(*args))
    assert "link is a link to" in line and "which leads to no folder" in line
    assert "--resume" not in line and "already exists" not in line
    assert (here / "link").is_symlink() and not (here / "nowhere").exists()


# -- GITHUB_STEP_SUMMARY naming a file the gate itself wrote (--junit-xml, the new
# baseline of --update-baseline), as a CI script that points both at one report file may:
# the Markdown table was appended to the XML or JSON just written, which no reader then
# took ("not well-formed", "Extra data"), exit 0. It is now a warning, the file left whole.

SUMMARY_ONTO = {
    "--junit-xml": ("out.xml", lambda p: xml.dom.minidom.parse(str(p))),
    "--update-baseline": ("base.json", lambda p: json.loads(p.read_text())),
}


@pytest.mark.parametrize("by_link", [False, True], ids=["by its name", "by a link"])
@pytest.mark.parametrize("flag", SUMMARY_ONTO)
def test_the_step_summary_is_not_appended_to_the_gates_own_output(
    run_cli: Any, here: Path, made_run: Path, monkeypatch: pytest.MonkeyPatch, flag: str,
    by_link: bool,
) -> None:  # fmt: skip
    (here / "g.toml").write_text(GATE_TOML)
    name, parse = SUMMARY_ONTO[flag]
    summary = here / "summary.md"
    if by_link:
        summary.symlink_to(here / name)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary if by_link else here / name))
    code, out, err = run_cli("gate", str(made_run), "--config", "g.toml", flag, name)
    assert code == 0 and "passed" in out
    assert "an output of this command" in err and len(err.strip().splitlines()) == 1
    parse(here / name)  # whole: parses as what it is


# ... while a summary file of its own is still appended to.
def test_a_summary_file_of_its_own_is_still_written(
    run_cli: Any, here: Path, made_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (here / "g.toml").write_text(GATE_TOML)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(here / "summary.md"))
    code, _, err = run_cli("gate", str(made_run), "--config", "g.toml", "--junit-xml", "j.xml")
    assert code == 0 and not err
    assert "max_peak" in (here / "summary.md").read_text()
    assert os.path.getsize(here / "j.xml") > 0


# -- a long option typed with one dash (`-tokens 64`, as other tools spell them): click
# reads the word as short options, and said "No such option: -t", a letter never typed on
# its own; `-quiet` got past the real -q to "No such option: -u". The word is named, with
# the two dashes it takes.

ONE_DASH = {
    "sweep -tokens": (["sweep", "-tokens", "64"], "tokens"),
    "sweep -quiet, past the real -q": (["sweep", "-quiet"], "quiet"),
    "plan -budget": (["plan", "-budget", "80GiB", "--vocab", "128"], "budget"),
    "plan -no-reserved, a negated flag": (["plan", "--budget", "1GiB", "-no-reserved"],
                                          "no-reserved"),
    "gate -junit-xml=FILE": (["gate", "run", "-junit-xml=j.xml"], "junit-xml"),
    "attribute -top": (["attribute", "s.pickle", "-top", "3"], "top"),
    "memprobe -version": (["-version"], "version"),
}  # fmt: skip


@pytest.mark.parametrize("what", ONE_DASH)
def test_a_long_option_with_one_dash_is_named(run_cli: Any, what: str) -> None:
    args, word = ONE_DASH[what]
    line = one_line(*run_cli(*args))
    assert f"No such option: -{word} (a long option takes two dashes: --{word})" in line


# ... while a word that spells no option of the command keeps click's own line.
@pytest.mark.parametrize("args", [["sweep", "-xyz"], ["sweep", "-q", "-t"]])
def test_no_long_option_is_guessed_where_none_is_spelled(run_cli: Any, args: list[str]) -> None:
    line = one_line(*run_cli(*args))
    assert "No such option: -" in line and "two dashes" not in line
