"""Hostile inputs, round 31 (user code memprobe imports and runs: a user's kernel, its
module's globals, what it keeps between calls): each row is a variant of a defect class
the pass found. A sane answer, said so. The classes, in order: an input memprobe gave an
earlier case that the kernel kept; a cache two kernels of one module share; plan's search
reading a kernel that keeps memory beside what its last searched size left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, user_module
from launch import forked_pytest

pytest_plugins = ["pytester"]

SWEEP = ["sweep", "--tokens", "64,128", "--vocab", "128", "--no-ladder", "--device", "meta",
         "--no-verify", "--no-report", "--json"]  # fmt: skip
LOGITS_64 = 64 * 128 * 2  # bf16 [1, 64, 128]

# A kernel module: globals ``{pre}``, then kernels ``k`` and ``j`` that each run ``{body}``
# and memprobe's unchunked kernel.
KEEPING = (
    "import torch\nfrom memprobe.kernels import get_kernel\n_u = get_kernel('unchunked')\n"
    "{pre}\ndef k(logits, targets, *, chunk_size=None):\n    {body}\n"
    "    return _u(logits, targets)\n"
    "def j(logits, targets, *, chunk_size=None):\n    {body}\n"
    "    return _u(logits, targets)\n"
)


def _rows(out: str) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["kernel"], r["tokens"]): r for r in json.loads(out)["results"]}


# -- an input memprobe gave an earlier case, kept by the kernel: round 29 counted what a
# kernel allocated and kept, never the inputs it was given (left() skips them), so a kernel
# that appended each call's logits to a list read 229,888 B at 128 tokens, unchunked's,
# where the 64 tokens' logits (16,384 B) were live through it. memprobe drops its inputs
# after each case: one still live at the kernel's next case is the kernel's, counted there.
GIVEN = {
    "a list of every call's logits": ("_L = []", "_L.append(logits)", LOGITS_64),
    "a view of them": ("_L = []", "_L.append(logits[:1, :1])", LOGITS_64),
    "a detached alias": ("_L = []", "_L.append(logits.detach())", LOGITS_64),
    "an attribute of a global object": (
        "class _H: pass\n_h = _H(); _h.all = []",
        "_h.all.append(logits)",
        LOGITS_64,
    ),
}


@pytest.mark.parametrize("what", GIVEN)
def test_an_input_the_kernel_kept_is_in_its_later_peak(run_cli: Any, here: Path, what: str) -> None:
    pre, body, held = GIVEN[what]
    mod = user_module(here, "r31_given", KEEPING.format(pre=pre, body=body))
    code, out, err = run_cli(*SWEEP, "--kernel", f"{mod}:k,unchunked")
    assert code == 0, err
    rows = _rows(out)
    assert rows[f"{mod}:k", 64]["peak_bytes"] == rows["unchunked", 64]["peak_bytes"]
    later = rows[f"{mod}:k", 128]
    assert later["peak_bytes"] == rows["unchunked", 128]["peak_bytes"] + held
    assert f"holds {held:,} B the kernel kept from earlier cases" in later["note"]


# ...and an input the kernel only used (or dropped again before its peak) is not kept.
@pytest.mark.parametrize(
    "body",
    ["_L[:] = [logits]", "_L.append(logits); _L.clear()", "_L.append(logits.shape)"],
)
def test_an_input_the_kernel_let_go_is_not_held(run_cli: Any, here: Path, body: str) -> None:
    mod = user_module(here, "r31_let_go", KEEPING.format(pre="_L = []", body=body))
    code, out, err = run_cli(*SWEEP, "--kernel", f"{mod}:k,unchunked")
    assert code == 0, err
    rows = _rows(out)
    assert rows[f"{mod}:k", 128]["peak_bytes"] == rows["unchunked", 128]["peak_bytes"]


# -- a cache two kernels of one module share: what the first kept was held by kernel name,
# so the second's cases ran beside it uncounted (1,081,344 B at 128 tokens where 2 MiB of
# cache and scratch were live; alone it read 2,129,920 B), and its rows depended on the
# order the kernels were named in. What a kernel keeps is held by its module's kernels.
SHARED = {
    "setdefault of one key": "_S.setdefault('b', torch.empty(1 << 18, device=logits.device))",
    "made once, if missing": (
        "_S['b'] = _S['b'] if 'b' in _S else torch.empty(1 << 18, device=logits.device)"
    ),
}


@pytest.mark.parametrize("what", SHARED)
def test_a_cache_two_kernels_of_one_module_share_is_in_both(
    run_cli: Any, here: Path, what: str
) -> None:
    mod = user_module(here, "r31_shared", KEEPING.format(pre="_S = {}", body=SHARED[what]))
    code, out, err = run_cli(*SWEEP, "--kernel", f"{mod}:k,{mod}:j")
    assert code == 0, err
    rows = _rows(out)
    for tokens in (64, 128):
        assert rows[f"{mod}:j", tokens]["peak_bytes"] >= rows[f"{mod}:k", 64]["peak_bytes"]
    assert "kept from earlier cases" in rows[f"{mod}:j", 64]["note"]


# ...while a kernel of another module never holds it.
def test_a_cache_of_another_module_is_not_held(run_cli: Any, here: Path) -> None:
    body = SHARED["setdefault of one key"]
    mod = user_module(here, "r31_mine", KEEPING.format(pre="_S = {}", body=body))
    other = user_module(here, "r31_other", KEEPING.format(pre="", body="pass"))
    code, out, err = run_cli(*SWEEP, "--kernel", f"{mod}:k,{other}:k,unchunked")
    assert code == 0, err
    rows = _rows(out)
    assert rows[f"{other}:k", 128]["peak_bytes"] == rows["unchunked", 128]["peak_bytes"]
    assert not rows[f"{other}:k", 128]["note"]


# -- plan's search read a kernel that keeps memory beside what its last searched size left
# (a kernel keeping its last two calls' logits fitted unchunked's 583 tokens in 1 MiB: it
# holds the previous step's logits through every step). Each size is read as a training
# loop runs it, its second call beside what its first at that size kept.
PLANNED = {
    "the last two calls' logits": ("_L = []", "_L.append(logits); del _L[:-2]", 511),
    "one buffer made once": (
        "_B = []",
        "_B.append(torch.empty(1 << 17, device=logits.device)) if not _B else None",
        291,  # (1 MiB - 512 KiB) at unchunked's 1,792 B a token, beside its fixed bytes
    ),
    # Round 32: what it keeps at the other sizes plan tried, a loop at one size never made
    # (a 1 MiB buffer per shape fitted 965 tokens in 8 MiB, each tried size's counted).
    "a buffer per shape": (
        "_B = {}",
        "_B.setdefault(tuple(logits.shape), torch.empty(1 << 16, device=logits.device))",
        437,  # (1 MiB - 256 KiB - fixed) at 1,792 B a token
    ),
    "a float32 copy of its first call's logits": (
        "_B = []",
        "_B.append(logits.detach().float()) if not _B else None",
        454,  # 1 MiB at 1,792 + 512 B a token: the copy is as long as the size planned
    ),
}


@pytest.mark.parametrize("what", PLANNED)
def test_plan_fits_a_kernel_as_a_training_loop_runs_it(run_cli: Any, here: Path, what: str) -> None:
    pre, body, fits = PLANNED[what]
    mod = user_module(here, "r31_plan", KEEPING.format(pre=pre, body=body))
    code, out, err = run_cli("plan", "--vocab", "128", "--budget", "1MiB", "--no-reserved",
                             "--kernel", f"{mod}:k,unchunked")  # fmt: skip
    assert code == 0, err
    table = {line.split()[0]: line.split()[4] for line in out.splitlines()[2:4]}
    assert table == {f"{mod}:k": f"{fits:,}", "unchunked": "583"}
    assert f"kept memory: {mod}:k keeps memory between calls" in out


# ...and so in plan's forked workers, which leave each size of such a kernel to the
# planning process (a worker holds what it kept at the sizes it simulated before).
def test_plan_workers_fit_a_kernel_as_a_training_loop_runs_it(run_cli: Any, here: Path) -> None:
    pre, body, fits = PLANNED["a buffer per shape"]
    mod = user_module(here, "r32_pool", KEEPING.format(pre=pre, body=body))
    code, out, err = run_cli("plan", "--vocab", "128", "--budget", "1MiB", "--no-reserved",
                             "--jobs", "2", "--kernel", f"{mod}:k,{mod}:j")  # fmt: skip
    assert code == 0, err
    table = {line.split()[0]: line.split()[4] for line in out.splitlines()[2:4]}
    assert table == {f"{mod}:k": f"{fits:,}", f"{mod}:j": f"{fits:,}"}


# ...and a kernel that ends such a process is one line naming it and the size.
def test_a_kernel_ending_its_own_process_is_one_line(run_cli: Any, here: Path) -> None:
    child = "__import__('multiprocessing').parent_process() is not None"
    body = f"_B.append(logits)\n    if {child}: __import__('os')._exit(3)"
    mod = user_module(here, "r32_exit", KEEPING.format(pre="_B = []", body=body))
    line = one_line(*run_cli("plan", "--vocab", "128", "--budget", "1MiB", "--no-reserved",
                             "--kernel", f"{mod}:k"))  # fmt: skip
    assert line.startswith(f"memprobe: error: {mod}:k ended the process that simulated it at")


# -- a tensor's storage grown in place was never seen to grow: the tracker registers a
# storage once, at the op that made it, so ``x = torch.empty(1); x.resize_(1 << 20)`` read
# as its 4 bytes (a kernel holding that 4 MiB scratch through its forward read unchunked's
# 114,944 B, and a marked test holding it passed a 1 MiB limit). A held storage that grew
# under an op is re-allocated at its new size.
GROWN = {
    "resize_ from one element": (
        "x = torch.empty(1, device=logits.device); x.resize_(1 << 20)",
        1 << 22,
    ),
    "resize_ after shrinking": (
        "x = torch.empty(1 << 20, device=logits.device); x.resize_(1); x.resize_(1 << 20)",
        1 << 22,
    ),
    "resize_as_ a float copy": (
        "x = torch.empty(1, device=logits.device); x.resize_as_(logits.float())",
        64 * 128 * 4,
    ),
    "an out= given empty": (
        "x = torch.empty(0, device=logits.device)\n"
        "    with torch.no_grad(): torch.exp(logits, out=x)",
        64 * 128 * 4,
    ),
}
SCRATCH = (
    "import torch\nfrom memprobe.kernels import get_kernel\n_u = get_kernel('unchunked')\n"
    "def k(logits, targets, *, chunk_size=None):\n    {body}\n    return _u(logits, targets)\n"
)


@pytest.mark.parametrize("what", GROWN)
def test_a_storage_grown_in_place_is_counted_at_its_size(
    run_cli: Any, here: Path, what: str
) -> None:
    body, grown = GROWN[what]
    kernel = user_module(here, "r31_grown", SCRATCH.format(body=body)) + ":k"
    sweep = [a if a != "64,128" else "64" for a in SWEEP]
    code, out, err = run_cli(*sweep, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    mine, own = json.loads(out)["results"]
    assert mine["forward_peak_bytes"] >= own["forward_peak_bytes"] + grown


# ...and an in-place op that keeps its storage's size is no new allocation.
def test_an_in_place_op_of_the_same_size_is_no_allocation(run_cli: Any, here: Path) -> None:
    body = "x = torch.empty(64, device=logits.device); x.resize_(8); x.add_(1); x.resize_(64)"
    kernel = user_module(here, "r31_same", SCRATCH.format(body=body)) + ":k"
    sweep = [a if a != "64,128" else "64" for a in SWEEP]
    code, out, err = run_cli(*sweep, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    mine, own = json.loads(out)["results"]
    assert mine["forward_peak_bytes"] == own["forward_peak_bytes"] + 256


# The same for a marked test: a tensor resized past the limit fails it.
@pytest.mark.multiprocess
@pytest.mark.parametrize("grow", ["x.resize_(1 << 20)", "x.resize_as_(torch.empty(1 << 20))"])
def test_a_marked_test_growing_a_tensor_is_over_its_limit(
    pytester: pytest.Pytester, grow: str
) -> None:
    pytester.makepyfile(
        "import torch, pytest\n"
        "@pytest.mark.limit_peak_memory('1 MiB', device='meta')\n"
        f"def test_it():\n    x = torch.empty(1, device='meta')\n    {grow}\n"
    )
    result = forked_pytest(pytester, "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*peaked at *MiB on meta, over the limit 1.00 MiB*"])
