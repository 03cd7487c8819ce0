"""The README's commands, run: each fast one exits 0 and prints every line it quotes.

Commands are the ``memprobe …`` lines of its ``sh`` blocks and the ``$ …`` lines of a
sample-output block (a block opening with one); a ``text`` block right after an ``sh``
block is that command's output, and in a sample block each ``$`` line's output is the
lines up to the next. A ``$`` line may start with ``cd DIR &&`` (a shell session: the
later commands run there too) and ``NAME=value`` settings, and end with ``> /dev/null``
(nothing quoted). Every command is either run here, run in order with the ones it
needs (:data:`IN_ORDER`), or listed in :data:`NOT_RUN` with the reason, so a new README
command must be classified. Quoted lines are compared after normalizing times;
``...``/``…`` lines stand for output left out.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"

# Commands not run here, by how they start (a key ending in ``$``: the whole line), and why.
NOT_RUN = {
    "memprobe sweep --tokens 20000 --vocab 131072": (
        "sweeps at the headline shape, 10-25 s on meta, and measured for real where a GPU is "
        "(filtered alone needs 85 GiB there)"
    ),
    "memprobe plan --vocab 131072 --budget 80GiB --other 54GiB$": (
        "plans every kernel at the headline shape (2.4 s of CPU in a warm process); checked "
        "against its output by tests/plan/test_plan_cli.py::test_docs_show_what_the_command_prints"
    ),
    "memprobe sweep --tokens 160000": "a ladder to 160,000 tokens: heavy on a GPU machine",
    "memprobe report RUN_DIR": "a synopsis, not a command",
    "memprobe attribute step_ctx512.pickle": "a public snapshot not in the repository",
    "memprobe diff forward_ctx128.pickle": "public snapshots not in the repository",
    "memprobe diff fp32.pickle": (
        "snapshots of two tests/attribute/corpus.py programs, which the README does not make"
    ),
    "memprobe gate [RESULTS]": "a synopsis, not a command",
    "memprobe attribute gnn_3gpu.pickle": "a public snapshot not in the repository",
    "memprobe step --config llama8b/config.json --tokens 20000 --checkpointing --fsdp 8": (
        "sharded 8B steps, 12-14 s of CPU each: benchmarks/bench_sharded_step.py runs them"
    ),
    "memprobe plan --step --config examples/llama1b": (
        "a search of whole 1B steps (examples/llama1b/config.json, Llama 3.2 1B's shape): "
        "about 25 s of CPU"
    ),
}

# The origin story ("From an OOM to a fit"): each reads what the one before wrote, so
# they run in this order, in one directory (test_origin_story_prints_what_it_quotes).
IN_ORDER = (
    "memprobe profile origin_step:train_step --out step.pickle ",
    "memprobe attribute step.pickle --what-if local_chunked",
    "memprobe profile origin_step:train_step --out step-8k.pickle",
    "memprobe plan --vocab 131072 --budget 80GiB --other-from step.pickle,step-8k.pickle",
)


def _not_run(line: str) -> bool:
    return any(line == k[:-1] if k.endswith("$") else line.startswith(k) for k in NOT_RUN)


def _in_order(line: str) -> bool:
    return any(line.startswith(k) for k in IN_ORDER)


@dataclass(frozen=True)
class Command:
    line: str
    quoted: tuple[str, ...]  # output lines the README shows for it
    cwd: str = ""  # the folder a `cd DIR &&` before it (or before an earlier one) went to
    env: tuple[tuple[str, str], ...] = ()  # NAME=value settings before it


def _blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)


def readme_commands() -> list[Command]:
    blocks = _blocks(README.read_text(encoding="utf-8"))
    out: list[Command] = []
    cwd = ""
    for i, (lang, body) in enumerate(blocks):
        lines = body.splitlines()
        if lang == "sh":
            following = blocks[i + 1] if i + 1 < len(blocks) else ("", "")
            quoted = tuple(following[1].splitlines()) if following[0] == "text" else ()
            cmds = [x.split("  #")[0].strip() for x in lines if x.startswith("memprobe ")]
            out += [Command(c, quoted if len(cmds) == 1 else ()) for c in cmds]
        elif lang == "" and lines and lines[0].startswith("$ "):
            starts = [j for j, x in enumerate(lines) if x.startswith("$ ")] + [len(lines)]
            for j, end in zip(starts, starts[1:], strict=False):
                command = _session_line(lines[j][2:], tuple(lines[j + 1 : end]), cwd)
                cwd = command.cwd
                if command.line.startswith("memprobe "):
                    out.append(command)
    return out


def _session_line(text: str, quoted: tuple[str, ...], cwd: str) -> Command:
    """One ``$`` line: ``cd DIR &&`` (which stays), ``NAME=value`` settings, ``> /dev/null``."""
    if m := re.match(r"cd (\S+) && (.*)", text):
        cwd, text = m[1], m[2]
    env = []
    while m := re.match(r"([A-Z_]+)=(\S+) (.*)", text):
        env.append((m[1], m[2]))
        text = m[3]
    if text.endswith("> /dev/null"):
        text, quoted = text[: -len("> /dev/null")].rstrip(), ()
    return Command(text, quoted, cwd, tuple(env))


def _normal(line: str) -> str:
    line = re.sub(r"\b\d+(\.\d+)? ?(ms|us|µs|s)\b", "<time>", line)
    return line.rstrip()


def _run_these() -> list[Command]:
    return [c for c in readme_commands() if not _not_run(c.line) and not _in_order(c.line)]


def test_every_readme_command_is_run_or_says_why_not() -> None:
    commands = readme_commands()
    assert len(commands) >= 10  # the extraction finds them
    for key in NOT_RUN:  # no stale entries
        assert any(_not_run(c.line) and c.line.startswith(key.rstrip("$")) for c in commands), key
    assert {c.line.split()[1] for c in _run_these()} >= {"kernels", "profile", "plan", "step"}
    # The sample blocks' later `$` lines, `cd DIR &&` and NAME=value are read too.
    origin = [c for c in commands if _in_order(c.line)]
    assert [c.line for c in origin] == sorted((c.line for c in origin), key=_order)
    assert len(origin) == len(IN_ORDER) and all(c.cwd == "benchmarks" for c in origin)
    assert ("TOKENS", "8000") in origin[2].env and not origin[2].quoted


def _order(line: str) -> int:
    return next(i for i, k in enumerate(IN_ORDER) if line.startswith(k))


def _write_python_files(cwd: Path) -> None:
    """Files the README writes for its commands (a block opening ``# name.py``, and an
    ``sh`` line ``mkdir -p DIR && echo '...' > DIR/FILE``)."""
    for lang, body in _blocks(README.read_text(encoding="utf-8")):
        first = body.splitlines()[0] if body else ""
        if lang == "python" and re.fullmatch(r"# \w+\.py", first):
            (cwd / first[2:]).write_text(body, encoding="utf-8")
        for m in re.finditer(r"^mkdir -p (\S+) && echo '(.*)' > (\S+)$", body, flags=re.M):
            (cwd / m[1]).mkdir(parents=True, exist_ok=True)
            (cwd / m[3]).write_text(m[2] + "\n", encoding="utf-8")


@pytest.mark.parametrize("command", _run_these(), ids=lambda c: c.line)
def test_readme_command_prints_what_it_quotes(command, run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_python_files(tmp_path)
    _prints_what_it_quotes(command, run_cli)


def _prints_what_it_quotes(command: Command, run_cli) -> None:
    code, out, err = run_cli(*shlex.split(command.line)[1:])
    assert code == 0, err
    printed = {_normal(line) for line in out.splitlines()}
    for line in command.quoted:
        if not line.strip() or line.strip() in ("...", "…") or "…" in line:
            continue
        assert _normal(line) in printed, f"README quotes {line!r}; {command.line} printed:\n{out}"


def test_origin_story_prints_what_it_quotes(run_cli, tmp_path, monkeypatch):
    """Profile the origin step, ask --what-if, profile it at 8,000 tokens, plan from both:
    each in the folder the README's `cd` left, as a shell session would (about 10 s)."""
    (tmp_path / "benchmarks").mkdir()
    origin = Path(__file__).parents[1] / "benchmarks" / "origin_step.py"
    (tmp_path / "benchmarks" / "origin_step.py").write_text(origin.read_text(encoding="utf-8"))
    commands = sorted(
        (c for c in readme_commands() if _in_order(c.line)), key=lambda c: _order(c.line)
    )
    for command in commands:
        monkeypatch.chdir(tmp_path / command.cwd)
        monkeypatch.delitem(sys.modules, "origin_step", raising=False)  # reads TOKENS on import
        with monkeypatch.context() as m:
            for name, value in command.env:
                m.setenv(name, value)
            _prints_what_it_quotes(command, run_cli)
    assert (tmp_path / "benchmarks" / "step-8k.pickle").is_file()
