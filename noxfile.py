"""Developer sessions: `nox -s tests`, `nox -s lint`, `nox -s typecheck`, `nox -s bench`,
`nox -s hidden`, `nox -s filtered`."""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
# The tested torch version. Pinning it does not pick the CPU build: on Linux x86_64 PyPI's
# wheel is the CUDA one (README, Quick start); a CPU-only runner needs PyTorch's CPU index
# or a local wheel of this version, as this project's machines have.
TORCH = "torch==2.13.0"


@nox.session
def tests(session: nox.Session) -> None:
    session.install(TORCH, "-e", ".[test]")
    session.run("python", "-m", "pytest", "-q", "-n", "auto", *session.posargs)


# The checkers' pinned versions live in pyproject's `lint` extra (CI installs the same);
# `hf` too, so that mypy sees transformers' types where memprobe imports it.
LINT = ".[hf,lint]"


@nox.session
def lint(session: nox.Session) -> None:
    session.install(TORCH, "-e", LINT)
    session.run("ruff", "check", "memprobe", "tests", "benchmarks", "noxfile.py")
    session.run("ruff", "format", "--check", "memprobe", "tests", "benchmarks", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy on the package under [tool.mypy] (0 errors, as in .ci/run)."""
    session.install(TORCH, "-e", LINT)
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """Speed and memory targets: per-case simulation time and the headline end to end."""
    session.install(TORCH, "-e", ".")
    for script in sorted(Path("benchmarks").glob("bench_*.py")):
        session.run("python", str(script))


@nox.session
def hidden(session: nox.Session) -> None:
    """The hidden family's memory, numerics and CPU speed; local_tiled's speed."""
    session.install(TORCH, "-e", ".")
    for script in ("hidden_memory", "hidden_numerics", "hidden_speed", "tiled_speed"):
        session.run("python", f"benchmarks/{script}.py")


@nox.session
def filtered(session: nox.Session) -> None:
    """filtered_chunked's numerics against float64 and its CPU speed against local_chunked."""
    session.install(TORCH, "-e", ".")
    for script in ("filtered_numerics", "filtered_speed"):
        session.run("python", f"benchmarks/{script}.py")
