"""Developer sessions: `nox -s tests`, `nox -s lint`, `nox -s bench`, `nox -s hidden`."""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint"]
# The tested torch version. Pinning it does not pick the CPU build: on Linux x86_64 PyPI's
# wheel is the CUDA one (README, Quick start); a CPU-only runner needs PyTorch's CPU index
# or a local wheel of this version, as this project's machines have.
TORCH = "torch==2.13.0"


@nox.session
def tests(session: nox.Session) -> None:
    session.install(TORCH, "-e", ".[test]")
    session.run("python", "-m", "pytest", "-q", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.5")
    session.run("ruff", "check", "memprobe", "tests", "benchmarks", "noxfile.py")
    session.run("ruff", "format", "--check", "memprobe", "tests", "benchmarks", "noxfile.py")


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
