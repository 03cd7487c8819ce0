"""The README's commands, run: each fast one exits 0 and prints every line it quotes.

Commands are the ``memprobe …`` lines of its ``sh`` blocks and the ``$ memprobe …`` line
opening a sample-output block; a ``text`` block right after an ``sh`` block is that
command's output. Every command is either run here or listed in :data:`NOT_RUN` with the
reason, so a new README command must be classified. Quoted lines are compared after
normalizing times; ``...``/``…`` lines stand for output left out.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"

# Commands not run here, by how they start, and why.
NOT_RUN = {
    "memprobe sweep --tokens 20000 --vocab 131072": "a full sweep with its report: tens of s",
    "memprobe plan --vocab 131072 --budget 80GiB --other 54GiB": (
        "plans at the headline shape, 4 s to minutes; the first is checked against its "
        "output by tests/plan/test_plan_cli.py::test_docs_show_what_the_command_prints"
    ),
    "memprobe sweep --tokens 160000": "a ladder to 160,000 tokens: heavy",
    "memprobe report RUN_DIR": "a synopsis, not a command",
    "memprobe attribute step_ctx512.pickle": "a public snapshot not in the repository",
    "memprobe diff forward_ctx128.pickle": "public snapshots not in the repository",
    "memprobe diff fp32.pickle": (
        "snapshots of two tests/attribute/corpus.py programs, which the README does not make"
    ),
    "memprobe gate [RESULTS]": "a synopsis, not a command",
    "memprobe attribute gnn_3gpu.pickle": "a public snapshot not in the repository",
    "memprobe step --config llama8b": (
        "an 8B step at 20,000 tokens, about a minute each: benchmarks/bench_step.py runs it"
    ),
    "memprobe plan --step --config examples/llama1b": (
        "a search of whole 1B steps (examples/llama1b/config.json, Llama 3.2 1B's shape): "
        "about 40 s of CPU"
    ),
    "memprobe attribute step.pickle --what-if": (
        "reads the 20,000-token origin_step snapshot (20 s to make): "
        "benchmarks/bench_what_if.py checks the prediction at that scale"
    ),
}


@dataclass(frozen=True)
class Command:
    line: str
    quoted: tuple[str, ...]  # output lines the README shows for it


def _blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)


def readme_commands() -> list[Command]:
    blocks = _blocks(README.read_text(encoding="utf-8"))
    out: list[Command] = []
    for i, (lang, body) in enumerate(blocks):
        lines = body.splitlines()
        if lang == "sh":
            following = blocks[i + 1] if i + 1 < len(blocks) else ("", "")
            quoted = tuple(following[1].splitlines()) if following[0] == "text" else ()
            cmds = [x.split("  #")[0].strip() for x in lines if x.startswith("memprobe ")]
            out += [Command(c, quoted if len(cmds) == 1 else ()) for c in cmds]
        elif lang == "" and lines and lines[0].startswith("$ memprobe "):
            out.append(Command(lines[0][2:], tuple(lines[1:])))
    return out


def _normal(line: str) -> str:
    line = re.sub(r"\b\d+(\.\d+)? ?(ms|us|µs|s)\b", "<time>", line)
    return line.rstrip()


def _run_these() -> list[Command]:
    return [c for c in readme_commands() if not any(c.line.startswith(k) for k in NOT_RUN)]


def test_every_readme_command_is_run_or_says_why_not() -> None:
    commands = readme_commands()
    assert len(commands) >= 10  # the extraction finds them
    for prefix in NOT_RUN:  # no stale entries
        assert any(c.line.startswith(prefix) for c in commands), prefix
    assert {c.line.split()[1] for c in _run_these()} >= {"kernels", "profile"}


def _write_python_files(cwd: Path) -> None:
    """Files the README writes for its commands (a block opening ``# name.py``)."""
    for lang, body in _blocks(README.read_text(encoding="utf-8")):
        first = body.splitlines()[0] if body else ""
        if lang == "python" and re.fullmatch(r"# \w+\.py", first):
            (cwd / first[2:]).write_text(body, encoding="utf-8")


@pytest.mark.parametrize("command", _run_these(), ids=lambda c: c.line)
def test_readme_command_prints_what_it_quotes(command, run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_python_files(tmp_path)
    code, out, err = run_cli(*shlex.split(command.line)[1:])
    assert code == 0, err
    printed = {_normal(line) for line in out.splitlines()}
    for line in command.quoted:
        if not line.strip() or line.strip() in ("...", "…") or "…" in line:
            continue
        assert _normal(line) in printed, f"README quotes {line!r}; {command.line} printed:\n{out}"
