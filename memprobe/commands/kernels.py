"""``memprobe kernels``: what ``memprobe.kernels`` ships, one line each."""

from __future__ import annotations

import typer


def command() -> None:
    """List the kernels memprobe ships: one line each, name and what it is."""
    from memprobe.kernels import KERNELS

    width = max(len(n) for n in KERNELS)
    for name, spec in KERNELS.items():
        typer.echo(f"{name:<{width}}  {spec.summary}")
