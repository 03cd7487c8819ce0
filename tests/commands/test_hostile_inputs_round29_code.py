"""Hostile inputs, round 29 (user code memprobe imports and runs: a user's kernel and its
backward, a user's step, the model config `memprobe step` builds from): each row is a
variant of a defect class the pass found. One line and exit 2, the case's error row, or a
sane answer. The classes, in order: a kernel giving its inputs other data (``.data =``);
memory a kernel keeps allocated between its calls."""

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


# -- memory a kernel keeps allocated between calls (a cache, a global it stores tensors in):
# a kernel that allocated a 4 MiB buffer at its first call had it in the first row's peak
# only (4,309,248 B at 64 tokens, then 229,888 B at 128, unchunked's own, status ok, no
# word), and plan, whose search calls it again and again, fitted it at unchunked's 4,670
# tokens in 8 MiB ("per token -252 B") where it holds 4 MiB more. What it keeps is in the
# peak of the case that made it and of every later case while it stays allocated, said so.
CACHES = {
    "one buffer, made once": (
        "_B = []",
        "if not _B: _B.append(torch.empty(1 << 20, device=logits.device))",
        1 << 22,
    ),
    "a buffer per shape": (
        "_B = {}",
        "_B.setdefault(tuple(logits.shape), torch.empty(1 << 18, device=logits.device))",
        1 << 20,
    ),
    "the last call's copy of the logits": (
        "_B = {}",
        "_B['x'] = logits.detach().clone()",
        64 * 128 * 2,
    ),
}
CACHED = (
    "import torch\nfrom memprobe.kernels import get_kernel\n_u = get_kernel('unchunked')\n"
    "{pre}\ndef k(logits, targets, *, chunk_size=None):\n    {body}\n"
    "    return _u(logits, targets)\n"
)


@pytest.mark.parametrize("what", CACHES)
def test_memory_a_kernel_keeps_between_calls_is_in_each_peak(
    run_cli: Any, here: Path, what: str
) -> None:
    pre, body, first = CACHES[what]
    kernel = user_module(here, "r29_cache", CACHED.format(pre=pre, body=body)) + ":k"
    sweep = [a if a != "64" else "64,128" for a in SWEEP]
    code, out, err = run_cli(*sweep, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    rows = {(r["kernel"], r["tokens"]): r for r in json.loads(out)["results"]}
    own = {t: rows["unchunked", t]["peak_bytes"] for t in (64, 128)}
    mine = rows[kernel, 64], rows[kernel, 128]
    assert mine[0]["peak_bytes"] == own[64] + first
    assert f"the kernel kept {first:,} B allocated" in mine[0]["note"]
    assert mine[1]["peak_bytes"] >= own[128] + first
    assert f"holds {first:,} B the kernel kept from earlier cases" in mine[1]["note"]
    assert not rows["unchunked", 128]["note"]


def test_plan_fits_a_kernel_beside_what_it_keeps(run_cli: Any, here: Path) -> None:
    pre, body, _ = CACHES["one buffer, made once"]
    kernel = user_module(here, "r29_plan_cache", CACHED.format(pre=pre, body=body)) + ":k"
    code, out, err = run_cli("plan", "--vocab", "128", "--budget", "8MiB", "--no-reserved",
                             "--kernel", f"{kernel},unchunked")  # fmt: skip
    assert code == 0, err
    table = {line.split()[0]: line.split()[4] for line in out.splitlines()[2:4]}
    assert table == {kernel: "2,335", "unchunked": "4,670"}


# A reference cycle the kernel made is garbage, not kept: no note, unchunked's peak.
@pytest.mark.parametrize(
    "body",
    [
        "c = [logits.detach() * 1]; c.append(c)",
        "class N: pass\n    n = N(); n.n = n; n.t = logits * 2",
    ],
)
def test_a_kernels_garbage_cycle_is_not_kept(run_cli: Any, here: Path, body: str) -> None:
    kernel = user_module(here, "r29_cycle", CACHED.format(pre="", body=body)) + ":k"
    code, out, err = run_cli(*SWEEP, "--kernel", kernel)
    assert code == 0, err
    (row,) = json.loads(out)["results"]
    assert row["status"] == "ok" and "kept" not in row["note"]
