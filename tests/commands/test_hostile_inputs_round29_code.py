"""Hostile inputs, round 29 (user code memprobe imports and runs: a user's kernel and its
backward, a user's step, the model config `memprobe step` builds from): each row is a
variant of a defect class the pass found. One line and exit 2, the case's error row, or a
sane answer. The classes, in order: a kernel giving its inputs other data (``.data =``);
memory a kernel keeps allocated between its calls; a kernel's tensors on another device
than its inputs' counted as theirs; memprobe_consumes_logits read by its truth."""

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


# ...and what it frees of that as a later case runs is freed there: a cache emptied first
# holds one buffer at a time, not two.
def test_a_kept_buffer_the_kernel_frees_is_freed_in_the_later_case(
    run_cli: Any, here: Path
) -> None:
    body = "_B.clear(); _B['x'] = torch.empty(1 << 18, device=logits.device)"
    kernel = user_module(here, "r29_cleared", CACHED.format(pre="_B = {}", body=body)) + ":k"
    sweep = [a if a != "64" else "64,128" for a in SWEEP]
    code, out, err = run_cli(*sweep, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    rows = {(r["kernel"], r["tokens"]): r for r in json.loads(out)["results"]}
    assert rows[kernel, 128]["peak_bytes"] == rows["unchunked", 128]["peak_bytes"] + (1 << 20)


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


# -- a kernel's tensors on another device than its inputs' counted as the inputs' device's
# memory: a host scratch buffer (``torch.empty(n)``, no device) read as 4 MiB more of a
# meta case's device memory (4,276,224 B where unchunked's 114,944 B is all a GPU's
# allocator would count), and `attribute --what-if` predicted 16.70 MiB for a kernel whose
# only addition was 16 MiB on the host; a ``device="meta"`` scratch read as 4 MiB of a CPU
# case's real memory. Only the inputs' device is counted, and the row says what was not.
ELSEWHERE = {
    "host scratch, no device": ("meta", "s = torch.empty(1 << 20)"),
    "host scratch, device named": ("meta", "s = torch.ones(1 << 20, device='cpu')"),
    "host scratch, a torch.device": (
        "meta",
        "s = torch.zeros(64, 128, device=torch.device('cpu'))",
    ),
    "meta scratch on a CPU case": ("cpu", "s = torch.empty(1 << 20, device='meta')"),
}


@pytest.mark.parametrize("what", ELSEWHERE)
def test_a_kernels_tensors_elsewhere_are_not_its_devices_memory(
    run_cli: Any, here: Path, what: str
) -> None:
    device, body = ELSEWHERE[what]
    kernel = user_module(here, "r29_elsewhere", CACHED.format(pre="", body=body)) + ":k"
    shape = ["--tokens", "16", "--vocab", "32"] if device == "cpu" else []
    sweep = [*SWEEP, "--device", device, *shape]
    code, out, err = run_cli(*sweep, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    mine, own = json.loads(out)["results"]
    assert mine["peak_bytes"] == own["peak_bytes"]
    assert "another device than its inputs' (1 on " in mine["note"] and not own["note"]


# ...and a tensor made elsewhere then moved to the inputs' device is counted there.
def test_a_kernels_host_tensor_moved_to_its_device_is_counted(run_cli: Any, here: Path) -> None:
    body = "s = torch.empty(1 << 20).to(logits.device)"
    kernel = user_module(here, "r29_moved", CACHED.format(pre="", body=body)) + ":k"
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    mine, own = json.loads(out)["results"]
    assert mine["peak_bytes"] == own["forward_peak_bytes"] + 4 * (1 << 20)  # freed at return


# A step whose loss --what-if finds (round 21's).
LOSS_STEP = (
    "import torch\n"
    "def step(device):\n"
    "    w = torch.zeros(512, 64, device=device, dtype=torch.bfloat16, requires_grad=True)\n"
    "    h = torch.zeros(1, 128, 64, device=device, dtype=torch.bfloat16, requires_grad=True)\n"
    "    t = torch.zeros(1, 128, 1, dtype=torch.long, device=device)\n"
    "    lp = torch.log_softmax((h @ w.T).float(), -1).gather(-1, t)\n"
    "    (-lp.mean()).backward()\n"
)


def test_a_what_if_kernels_host_scratch_is_not_the_steps(run_cli: Any, here: Path) -> None:
    step = user_module(here, "r29_loss_step", LOSS_STEP)
    code, _, err = run_cli("profile", f"{step}:step", "--out", "s.pickle", "--top", "1")
    assert code == 0, err
    body = "s = torch.empty(1 << 22)"
    kernel = user_module(here, "r29_whatif_host", CACHED.format(pre="", body=body)) + ":k"
    said = []
    for name in (kernel, "unchunked"):
        code, out, err = run_cli("attribute", "s.pickle", "--what-if", name, "--json")
        assert code == 0, err
        said.append(json.loads(out)["what_if"]["predicted_peak_bytes"])
    assert said[0] == said[1]


# -- memprobe_consumes_logits read by its truth: "False" (or "no", 1, a list) said the
# kernel consumes its logits, and its row's floor dropped their gradient (16,384 B where it
# holds 32,768 B; peak over floor 7.0, not 3.5) with no word. Only True or False is read.
NOT_BOOLS = {
    "the string 'False'": ("'False'", "'False'"),
    "the string 'no'": ("'no'", "'no'"),
    "the integer 1": ("1", "int"),
    "a list": ("[True]", "list"),
    "a str subclass": ("type('S', (str,), {'__repr__': lambda s: 'True'})('x')", "'x'"),
}
CONSUMES = (
    "import torch\nfrom memprobe.kernels import get_kernel\n_u = get_kernel('unchunked')\n"
    "def k(logits, targets, *, chunk_size=None):\n    return _u(logits, targets)\n"
    "k.memprobe_consumes_logits = {value}\n"
)


@pytest.mark.parametrize("what", NOT_BOOLS)
def test_a_consumes_flag_that_is_not_a_bool_is_one_line(
    run_cli: Any, here: Path, what: str
) -> None:
    value, said = NOT_BOOLS[what]
    kernel = user_module(here, "r29_consumes", CONSUMES.format(value=value)) + ":k"
    err = one_line(*run_cli(*SWEEP, "--kernel", kernel))
    assert f"memprobe_consumes_logits is {said}, not True or False" in err


@pytest.mark.parametrize("value", ["True", "False", "None"])
def test_a_consumes_flag_that_is_a_bool_is_read(run_cli: Any, here: Path, value: str) -> None:
    kernel = user_module(here, "r29_consumes_ok", CONSUMES.format(value=value)) + ":k"
    code, out, err = run_cli(*SWEEP, "--kernel", kernel)
    assert code == 0, err
    (row,) = json.loads(out)["results"]
    assert row["floor_bytes"] == 64 * 128 * 2 * (1 if value == "True" else 2)
