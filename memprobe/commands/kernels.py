"""``memprobe kernels``: what ``memprobe.kernels`` ships, one row each, by input protocol."""

from __future__ import annotations

from memprobe.render.console import Part

HEADINGS = {
    "logits": "logits kernels: fn(logits [B,S,V], targets [B,S], *, chunk_size=None)",
    "hidden": (
        "hidden family (sweep/plan --hidden H): "
        "fn(hidden [B,S,H], weight [V,H], targets [B,S], *, chunk_size=None)"
    ),
}


def kernel_parts() -> list[Part]:
    """The listing as printable parts: a heading and a table per protocol, then the
    GPU peers with whether each can run here."""
    from memprobe.kernels import KERNELS
    from memprobe.kernels.peers import PEERS, unavailable_reason
    from memprobe.render.console import table

    parts: list[Part] = []
    for protocol, heading in HEADINGS.items():
        names = [n for n, spec in KERNELS.items() if spec.inputs == protocol]
        if parts:
            parts.append("")
        parts.append(heading)
        rows = [(name, KERNELS[name].summary) for name in names]
        parts.append(table(("kernel", "what it is"), rows, left={"kernel", "what it is"}))
    parts += ["", "GPU peers (optional, Triton, CUDA only; negated to log-probs):"]
    peer_rows = []
    for name, spec in PEERS.items():
        why = unavailable_reason(name)
        state = f"unavailable: {why}" if why else "available"
        peer_rows.append((name, spec.inputs, state, spec.summary))
    every = ("kernel", "inputs", "here", "what it is")
    parts.append(table(every, peer_rows, left=set(every)))
    parts += ["", "your own: --kernel package.module:function (either protocol)"]
    return parts


HELP = """List the kernels memprobe ships: one row each, name and what it is."""


def command() -> None:
    from memprobe.render.console import show

    show(kernel_parts())
