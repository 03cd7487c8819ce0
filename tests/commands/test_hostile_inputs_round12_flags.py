"""Hostile inputs, round 12 (flags, environment, user code): each row is a variant of a
defect class the confirming pass found. One line and exit 2, or a sane answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_KERNEL, TINY_STEP, one_line, user_module
from small_config import SMALL


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
    target = f"{user_module(here, 'r12_getter', body)}:{attr}"
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
    err = one_line(*run_cli(*args))
    assert f"reading {attr.split('.')[-1]!r} from" in err and said in err, err
    assert not (here / "run").exists()


# -- `memprobe step --kernel` took whatever the kernel returned: a result that is not
# computed from the logits (a fresh leaf) stopped the backward before the model, so no
# gradient was made and the peak read about half the step's, exit 0; a scalar or a
# transposed result passed too, where sweep and plan refuse them

STEP_KERNELS = {
    # Round 20: a leaf is refused as the kernel returns it, before any backward.
    "a fresh leaf": (
        "    return torch.zeros(targets.shape, device=logits.device, requires_grad=True)\n",
        "result is a leaf",
    ),
    "a leaf computed beside the logits": (
        "    w = torch.zeros((), device=logits.device, requires_grad=True)\n"
        "    return torch.zeros(targets.shape, device=logits.device) * w\n",
        "do not depend on its logits",
    ),
    "a scalar": (
        "    return torch.log_softmax(logits.float(), -1).sum()\n",
        "a float32 tensor of shape []",
    ),
    "transposed": (
        "    lp = torch.log_softmax(logits.float(), -1)\n"
        "    return lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).T\n",
        "of shape [64, 1]",
    ),
    "the whole log-softmax": (
        "    return torch.log_softmax(logits.float(), -1)\n",
        "of shape [1, 64, 512]",
    ),
    "a tuple": ("    return (logits.float().sum(-1),)\n", "returned tuple"),
}


@pytest.mark.parametrize("kernel", STEP_KERNELS, ids=list(STEP_KERNELS))
@pytest.mark.parametrize("command", ["step", "plan --step"])
def test_a_step_kernel_is_held_to_the_kernel_contract(
    run_cli: Any, here: Path, kernel: str, command: str
) -> None:
    body, said = STEP_KERNELS[kernel]
    source = "import torch\ndef k(logits, targets, *, chunk_size=None):\n" + body
    target = f"{user_module(here, 'r12_stepk', source)}:k"
    config = _config(here)
    args = {
        "step": ["step", "--config", config, "--tokens", "64", "--kernel", target],
        "plan --step": [
            "plan",
            "--step",
            "--config",
            config,
            "--budget",
            "1GiB",
            "--no-reserved",
            "--kernel",
            target,
        ],  # fmt: skip
    }[command]
    err = one_line(*run_cli(*args))
    # The plan bisects over other token counts: its shapes differ from these.
    assert said in err or (command == "plan --step" and "log-prob per target" in err), err


def test_a_step_kernel_that_keeps_the_contract_still_runs(run_cli: Any, here: Path) -> None:
    target = f"{user_module(here, 'r12_stepk_ok', TINY_KERNEL)}:k"
    code, out, err = run_cli(
        "step", "--config", _config(here), "--tokens", "64", "--kernel", target, "--json"
    )
    assert code == 0, err
    assert json.loads(out)["peak_allocated_bytes"] > 0


# -- --alloc-conf backend:cudaMallocAsync: attribute --replay refused it, but sweep (meta,
# cpu), plan, plan --step, step and profile took it and printed the native allocator
# model's reserved peak as that backend's ("planned on memprobe's model of the CUDA
# caching allocator with backend:cudaMallocAsync")

ASYNC = ["backend:cudaMallocAsync", "expandable_segments:True,backend:cudaMallocAsync"]


@pytest.mark.parametrize("conf", ASYNC, ids=["alone", "with another option"])
@pytest.mark.parametrize(
    "command", ["sweep", "sweep --device cpu", "plan", "plan --step", "step", "profile"]
)
def test_an_allocator_backend_the_model_is_not_is_refused(
    run_cli: Any, here: Path, conf: str, command: str
) -> None:
    sweep = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--kernel", "unchunked",
             "--out", str(here / "run"), "-q", "--no-verify"]  # fmt: skip
    plan = ["plan", "--budget", "1GiB"]
    args = {
        "sweep": sweep,
        "sweep --device cpu": [*sweep, "--device", "cpu"],
        "plan": [*plan, "--vocab", "256", "--kernel", "local_chunked"],
        "plan --step": [*plan, "--step", "--config", _config(here)],
        "step": ["step", "--config", _config(here), "--tokens", "64"],
        "profile": [
            "profile",
            f"{user_module(here, 'r12_async_step', TINY_STEP)}:step",
        ],
    }[command]
    err = one_line(*run_cli(*args, "--alloc-conf", conf))
    assert "not backend:cudaMallocAsync" in err, err
    assert not (here / "run").exists()


def test_the_native_backend_named_is_still_modelled(run_cli: Any) -> None:
    args = ["plan", "--vocab", "256", "--kernel", "local_chunked", "--budget", "1GiB"]
    code, out, err = run_cli(*args, "--alloc-conf", "backend:native", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["max_tokens"] > 0
