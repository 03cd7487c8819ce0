"""Hostile inputs, round 29 (user code memprobe imports and runs: a user's kernel and its
backward, a user's step, the model config `memprobe step` builds from): each row is a
variant of a defect class the pass found. One line and exit 2, the case's error row, or a
sane answer. The classes, in order: a kernel giving its inputs other data (``.data =``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, user_module

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--device", "meta",
         "--no-verify", "--no-report", "--json"]  # fmt: skip
PLAN = ["plan", "--vocab", "128", "--budget", "1MiB", "--no-reserved"]

# A kernel module: a kernel that runs ``{pre}``, then memprobe's unchunked kernel, then
# ``{post}``.
KERNEL = (
    "import torch\nfrom memprobe.kernels import get_kernel\n_u = get_kernel('unchunked')\n"
    "def k(logits, targets, *, chunk_size=None):\n"
    "    {pre}\n    out = _u(logits, targets)\n    {post}\n    return out\n"
)
HIDDEN = (
    "import torch\nfrom memprobe.kernels import get_kernel\n"
    "_u = get_kernel('linear_unchunked')\n"
    "def k(hidden, weight, targets, *, chunk_size=None):\n"
    "    {pre}\n    return _u(hidden, weight, targets)\n"
)


def _kernel(here: Path, stem: str, pre: str = "pass", post: str = "pass") -> str:
    return user_module(here, stem, KERNEL.format(pre=pre, post=post)) + ":k"


# -- a kernel that gave the logits it was handed other data: ``logits.data =
# logits.data[:, :, :1]`` bumps no version counter, so round 27's check of writes into
# the inputs passed it, and the sweep's row read ok at 17,408 B where the kernel holds
# 114,944 B (it ran on a 128th of its logits); plan fitted it at that size too. A ``.data``
# of the same shape, before or after its forward, gave a row measured on other tensors.
OTHER_DATA = {
    "a slice of the vocabulary, before": ("logits.data = logits.data[:, :, :1]", "pass"),
    "half the vocabulary, before": ("logits.data = logits.data[:, :, :64]", "pass"),
    "another dtype, before": ("logits.data = logits.data.to(torch.float16)", "pass"),
    "the same shape, new storage": ("logits.data = torch.zeros_like(logits.data)", "pass"),
    "a slice, after its forward": ("pass", "logits.data = logits.data[:, :, :1]"),
    "a transpose's data": ("pass", "logits.data = logits.data.transpose(0, 1)"),
}


@pytest.mark.parametrize("what", OTHER_DATA)
def test_a_kernel_giving_its_logits_other_data_is_its_row(
    run_cli: Any, here: Path, what: str
) -> None:
    kernel = _kernel(here, "r29_data", *OTHER_DATA[what])
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert "other data (`.data =`" in rows[0]["note"]


def test_a_hidden_kernel_giving_its_weight_other_data_is_its_row(run_cli: Any, here: Path) -> None:
    body = HIDDEN.format(pre="weight.data = weight.data[:1]")
    kernel = user_module(here, "r29_hidden_data", body) + ":k"
    code, out, err = run_cli(*SWEEP, "--hidden", "32", "--kernel", kernel)
    assert code == 0, err
    (row,) = json.loads(out)["results"]
    assert row["status"] == "error" and "its weight other data" in row["note"]


def test_plan_refuses_a_kernel_giving_its_logits_other_data(run_cli: Any, here: Path) -> None:
    kernel = _kernel(here, "r29_plan_data", "logits.data = logits.data[:, :, :1]")
    err = one_line(*run_cli(*PLAN, "--kernel", kernel))
    assert "other data" in err


def test_a_kernel_writing_nothing_is_still_measured(run_cli: Any, here: Path) -> None:
    kernel = _kernel(here, "r29_clean", "x = logits.data", "y = logits.detach()")
    code, out, err = run_cli(*SWEEP, "--kernel", kernel)
    assert code == 0, err
    (row,) = json.loads(out)["results"]
    assert (row["status"], row["peak_bytes"]) == ("ok", 114944)
