"""Helpers the hostile-input tests share (tests/commands/test_hostile_inputs*.py)."""

from __future__ import annotations

import sys
from pathlib import Path


def one_line(code: int, out: str, err: str) -> str:
    """The contract for a bad input: exit 2, nothing on stdout, one line on stderr, no
    traceback. Returns that line."""
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, (code, out, err)
    assert "Traceback" not in err
    return err


def swept(run: Path, *flags: str) -> Path:
    """``memprobe sweep FLAGS --out RUN``, in this process (a fixture's run to copy)."""
    from memprobe import cli

    argv = sys.argv
    sys.argv = ["memprobe", "sweep", *flags, "--out", str(run)]
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code
    finally:
        sys.argv = argv
    return run


def profiled(here: Path, stem: str, body: str, name: str | None = None) -> Path:
    """``body`` written as module ``stem`` in ``here`` and its ``step`` profiled there by
    ``memprobe profile stem:step --out here/NAME.pickle`` (``name``: ``stem``), in this
    process (a fixture's snapshot, with memprobe's labels on every entry)."""
    from memprobe import cli

    (here / f"{stem}.py").write_text(body)
    out = here / f"{name or stem}.pickle"
    argv, path = sys.argv, list(sys.path)
    sys.path.insert(0, str(here))
    sys.argv = ["memprobe", "profile", f"{stem}:step", "--out", str(out), "--top", "1"]
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code
    finally:
        sys.argv, sys.path[:] = argv, path
    return out


def user_module(here: Path, stem: str, body: str) -> str:
    """Write ``body`` as an importable module in ``here``; its name, unique per body (a
    module imported once stays in sys.modules, so two bodies never share a name)."""
    name = f"{stem}_{abs(hash(body)) % 10**8}"
    (here / f"{name}.py").write_text(body)
    return name


# The smallest user step and kernel (a module body each): a step that allocates, runs
# backward and returns; a kernel that is memprobe's unchunked one.
TINY_STEP = (
    "import torch\n"
    "def step(device):\n"
    "    w = torch.zeros(8, 8, device=device, requires_grad=True)\n"
    "    (w @ w).sum().backward()\n"
)
TINY_KERNEL = (
    "from memprobe.kernels import get_kernel\n"
    "def k(logits, targets, *, chunk_size=None):\n"
    "    return get_kernel('unchunked')(logits, targets)\n"
)
