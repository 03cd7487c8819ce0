"""Hostile inputs, round 12 (flags, environment, user code): each row is a variant of a
defect class the confirming pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from small_config import SMALL

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


def _module(here: Path, stem: str, body: str) -> str:
    name = f"{stem}_{abs(hash(body)) % 10**8}"
    (here / f"{name}.py").write_text(body)
    return name


def _one_line(code: int, out: str, err: str) -> str:
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, (code, out, err)
    assert "Traceback" not in err
    return err


def _config(here: Path) -> str:
    (here / "config.json").write_text(json.dumps(SMALL))
    return str(here / "config.json")


# -- reading the step or kernel from its module raised something other than
# AttributeError (a module-level __getattr__, a class property, an exit in either): a
# traceback out of every command that imports user code

GETTERS = {
    "module __getattr__ raises": (
        "def __getattr__(name):\n    raise RuntimeError('no ' + name + ' here')\n",
        "fn",
        "RuntimeError: no fn here",
    ),
    "module __getattr__ exits": (
        "import sys\ndef __getattr__(name):\n    sys.exit('gone')\n",
        "fn",
        "SystemExit: gone",
    ),
    "class property raises": (
        "class C:\n    @property\n    def fn(self):\n        raise KeyError('fn')\nobj = C()\n",
        "obj.fn",
        "KeyError: 'fn'",
    ),
    "class attribute lookup raises": (
        "class Meta(type):\n    def __getattr__(cls, name):\n        raise ValueError(name)\n"
        "class C(metaclass=Meta):\n    pass\n",
        "C.fn",
        "ValueError: fn",
    ),
}


@pytest.mark.parametrize("getter", GETTERS, ids=list(GETTERS))
@pytest.mark.parametrize("command", ["profile", "plan --kernel", "sweep --kernel"])
def test_an_attribute_that_raises_on_reading_is_one_line(
    run_cli: Any, here: Path, getter: str, command: str
) -> None:
    body, attr, said = GETTERS[getter]
    target = f"{_module(here, 'r12_getter', body)}:{attr}"
    args = {
        "profile": ["profile", target],
        "plan --kernel": ["plan", "--vocab", "256", "--budget", "1GiB", "--kernel", target],
        "sweep --kernel": [
            "sweep",
            "--tokens",
            "64",
            "--vocab",
            "128",
            "--no-ladder",
            "--kernel",
            target,
            "--out",
            str(here / "run"),
            "-q",
            "--no-verify",
        ],  # fmt: skip
    }[command]
    err = _one_line(*run_cli(*args))
    assert f"reading {attr.split('.')[-1]!r} from" in err and said in err, err
    assert not (here / "run").exists()
