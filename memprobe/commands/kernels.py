"""``memprobe kernels``: what ``memprobe.kernels`` ships, one line each, by input protocol."""

from __future__ import annotations

import typer

HEADINGS = {
    "logits": "logits kernels: fn(logits [B,S,V], targets [B,S], *, chunk_size=None)",
    "hidden": (
        "hidden family (sweep/plan --hidden H): "
        "fn(hidden [B,S,H], weight [V,H], targets [B,S], *, chunk_size=None)"
    ),
}


def command() -> None:
    """List the kernels memprobe ships: one line each, name and what it is."""
    from memprobe.kernels import KERNELS

    width = max(len(n) for n in KERNELS)
    for protocol, heading in HEADINGS.items():
        names = [n for n, spec in KERNELS.items() if spec.inputs == protocol]
        if protocol != "logits":
            typer.echo("")
        typer.echo(heading)
        for name in names:
            typer.echo(f"  {name:<{width}}  {KERNELS[name].summary}")
    _list_peers()
    typer.echo("")
    typer.echo("your own: --kernel package.module:function (either protocol)")


def _list_peers() -> None:
    """The GPU peers, each with the protocol it takes and, where it cannot run here, why."""
    from memprobe.kernels.peers import PEERS, unavailable_reason

    width = max(len(n) for n in PEERS)
    typer.echo("")
    typer.echo("GPU peers (optional, Triton, CUDA only; negated to log-probs):")
    for name, spec in PEERS.items():
        why = unavailable_reason(name)
        state = f"unavailable: {why}" if why else "available"
        typer.echo(f"  {name:<{width}}  [{spec.inputs}] {spec.summary}; {state}")
