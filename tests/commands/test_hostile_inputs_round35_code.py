"""Hostile inputs, round 35 (user code memprobe runs: steps profiled, kernels swept, marked
tests): each row is a variant of a defect class the pass found, its peak computed by hand
(bytes = elements x dtype size). The classes, in order: a storage resized in place."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hostile import user_module

from memprobe.profile import trace_step

# -- a storage resized in place (``x.untyped_storage().resize_(n)``, FSDP's way to free and
# re-make an unsharded parameter, copied by hand-written offloading) runs below torch's
# dispatch: no mode saw it, so a storage freed that way read as still held, and one grown
# as its old size. A step freeing 4 KiB so and then making 3 KiB peaked at 7 KiB, not 4.
RESIZED = {
    "freed, then smaller tensors": (
        "x = torch.ones(1024, device=device)\nx.untyped_storage().resize_(0)\n"
        "y = torch.ones(512, device=device)\nz = torch.ones(256, device=device)",
        4096,
    ),
    "grown in place": (
        "x = torch.ones(256, device=device)\nx.untyped_storage().resize_(4096)\n"
        "y = torch.ones(256, device=device)",
        5120,
    ),
    "shrunk, then grown back": (
        "x = torch.ones(1024, device=device)\ns = x.untyped_storage()\ns.resize_(1024)\n"
        "y = torch.ones(1024, device=device)\ns.resize_(4096)",
        8192,
    ),
    "freed and re-made, FSDP-like": (
        "w = torch.ones(2048, device=device)\nw.untyped_storage().resize_(0)\n"
        "g = torch.ones(1024, device=device)\nw.untyped_storage().resize_(8192)\n"
        "h = torch.ones(256, device=device)",
        4096 + 8192 + 1024,
    ),
    "an empty storage resized to nothing": (
        "x = torch.empty(0, device=device)\nx.untyped_storage().resize_(0)\n"
        "y = torch.ones(256, device=device)",
        1024,
    ),
}


@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("what", RESIZED)
def test_a_storage_resized_in_place_is_freed_or_grown(what: str, device: str) -> None:
    body, expected = RESIZED[what]
    scope: dict[str, Any] = {}
    exec("import torch\ndef step(device):\n" + textwrap.indent(body, "    "), scope)
    assert trace_step(scope["step"], device).peak_bytes == expected


# ...in a swept kernel too: a 256 KiB scratch freed by resize before the unchunked work
# (80 KiB forward, 112.25 KiB with backward) peaks at the scratch beside the 16 KiB logits,
# 272 KiB, not 336 KiB (the scratch held on into forward).
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_a_kernel_freeing_scratch_by_resize(run_cli: Any, here: Path, device: str) -> None:
    mod = user_module(
        here,
        "r35_resize",
        "import torch\nfrom memprobe.kernels import get_kernel\n"
        "_u = get_kernel('unchunked')\n"
        "def k(logits, targets, *, chunk_size=None):\n"
        "    s = torch.empty(65536, device=logits.device)\n"
        "    s.untyped_storage().resize_(0)\n"
        "    return _u(logits, targets)\n",
    )
    run = here / f"run-{device}"
    flags = ("--tokens", "64", "--vocab", "128", "--no-ladder", "--device", device)
    code, _, err = run_cli("sweep", *flags, "--kernel", f"{mod}:k", "--out", str(run))
    assert code == 0, err
    (row,) = json.loads((run / "results.json").read_text())["rows"]
    assert (row["status"], row["peak_bytes"]) == ("ok", 272 * 1024), row


# ...and under the tracker a marked test runs its body in (its limit is checked against
# this peak), nested trackers included: the innermost one sees the resize.
@pytest.mark.parametrize(("size", "expected"), [(0, 2048), (4096, 6144), (1024, 3072)])
def test_the_tracker_a_marked_body_runs_in_sees_resizes(size: int, expected: int) -> None:
    import torch

    from memprobe.measure.tracker import AllocationTracker

    original = torch.UntypedStorage.resize_
    with AllocationTracker(device="meta") as outer, AllocationTracker(device="meta") as t:
        x = torch.ones(256, device="meta")
        x.untyped_storage().resize_(size)
        y = torch.ones(512, device="meta")
        del x, y
    assert t.peak_bytes == outer.peak_bytes == expected
    assert torch.UntypedStorage.resize_ is original  # put back when the last one exits
