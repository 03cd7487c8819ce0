"""Hostile inputs, round 28 (a new user): the README read top to bottom and every command
in it run as written, then the planning problems a user brings (an 8B model that runs out
of memory at 32k tokens, a Qwen-sized vocabulary under tensor parallel, a profiled step's
what-if, the pytest marker and the gate in a project of one's own). Each table is a
defect class the pass found where one output's hint or number did not hold against
another: a suggested command that fails when run, or two outputs that disagree."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, profiled

# -- N1: `plan --kernel liger_fused_linear_ce --hidden 4096` said "measure it on a GPU:
# memprobe sweep --device cuda --kernel liger_fused_linear_ce", and that sweep, run as
# written on the GPU, stops at "takes hidden states ... give the hidden size with
# --hidden": the hint dropped the flags the kernel needs to run at all (and the
# vocabulary, dtype and batch asked about). The hint now carries them; run on meta here
# (no GPU), it parses and plans the same cases (skipped rows, no flag error).

TRITON_PLANS = {
    "hidden peer": (["--kernel", "liger_fused_linear_ce", "--hidden", "64"], "--hidden 64"),
    "hidden peer, fp16": (
        ["--kernel", "liger_fused_linear_ce", "--hidden", "64", "--dtype", "fp16"],
        "--dtype fp16",
    ),
    "logits peer, batch 2": (["--kernel", "liger_cross_entropy", "--batch", "2"], "--batch 2"),
    "logits peer": (["--kernel", "liger_cross_entropy"], "--vocab 128"),
}


@pytest.mark.parametrize("flags,carried", list(TRITON_PLANS.values()), ids=list(TRITON_PLANS))
def test_triton_peer_plan_hint_runs_as_written(
    run_cli: Any, tmp_path: Path, flags: list[str], carried: str
) -> None:
    err = one_line(*run_cli("plan", "--vocab", "128", "--budget", "1GiB", *flags))
    hint = err.split("measure it on a GPU: ")[1].rstrip(")\n")
    assert carried in hint and "--vocab 128" in hint, err
    argv = shlex.split(hint)
    assert argv[:2] == ["memprobe", "sweep"], hint
    # No GPU here: the same sweep on meta must get past every flag check to its rows.
    argv = [a if a != "cuda" else "meta" for a in argv[1:]]
    code, out, err = run_cli(*argv, "--tokens", "64", "--no-ladder", "--no-report",
                             "--out", str(tmp_path / "run"))  # fmt: skip
    assert code == 0 and "skipped" in out, (code, err)


# -- N2: the gate's note on a failing case named its largest block "(op input: logits)",
# and `memprobe attribute` on the snapshot the note points at printed the same block as
# "op input:_logits" (the label's one-word spelling; the HTML page said "input: logits"
# too). The text reading now spells a harness input as the note and the page do.

INPUT_OPS = {
    "logits kernel": (["--kernel", "local_chunked"], "op input: logits"),
    "unchunked": (["--kernel", "unchunked"], "op input: logits"),
    "hidden kernel": (["--kernel", "fused_linear_chunked", "--hidden", "32"], "op input: weight"),
}


@pytest.mark.parametrize("flags,op", list(INPUT_OPS.values()), ids=list(INPUT_OPS))
def test_attribute_spells_a_harness_input_as_the_gate_note_does(
    run_cli: Any, tmp_path: Path, flags: list[str], op: str
) -> None:
    run = tmp_path / "run"
    code, _, err = run_cli("sweep", "--device", "meta", "--tokens", "64", "--vocab", "128",
                           "--no-ladder", "--no-report", "--out", str(run), *flags)  # fmt: skip
    assert code == 0, err
    (snapshot,) = (run / "snapshots").glob("*.pickle")
    code, out, err = run_cli("attribute", str(snapshot), "--top", "8")
    assert code == 0 and op in out and "input:_" not in out, (err, out)


# -- N1 (a kernel of one's own): `plan --hidden 32 --kernel mod:hk` with a hidden-family
# kernel that raises said "run `memprobe sweep --kernel mod:hk --device meta` at a small
# size to see it", and that sweep stops at "takes hidden states ... give the hidden size
# with --hidden" without running the kernel. `step --kernel mod:hk` said the same. The
# hint carries --hidden; a logits kernel's hint stays as it was.

RAISING = (
    "def hk(hidden, weight, targets, *, chunk_size=None):\n"
    "    raise ValueError('boom')\n"
    "def lk(logits, targets, *, chunk_size=None):\n"
    "    raise ValueError('boom')\n"
)
FAILING = {
    "plan, hidden kernel": (
        ["plan", "--vocab", "128", "--budget", "1GiB", "--hidden", "32", "--no-reserved"],
        "hk",
        "--hidden 32",
    ),  # fmt: skip
    "plan, logits kernel": (
        ["plan", "--vocab", "128", "--budget", "1GiB", "--no-reserved"],
        "lk",
        "",
    ),  # fmt: skip
    "plan, hidden kernel, tp 1": (
        [
            "plan",
            "--vocab",
            "128",
            "--budget",
            "1GiB",
            "--hidden",
            "48",
            "--tp",
            "1",
            "--no-reserved",
        ],
        "hk",
        "--hidden 48",
    ),  # fmt: skip
}


@pytest.mark.parametrize("args,fn,carried", list(FAILING.values()), ids=list(FAILING))
def test_a_raising_kernel_hint_runs_the_kernel(
    run_cli: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    fn: str,
    carried: str,
) -> None:
    from hostile import user_module

    monkeypatch.chdir(tmp_path)
    name = user_module(tmp_path, "r28_raising", RAISING)
    err = one_line(*run_cli(*args, "--kernel", f"{name}:{fn}"))
    hint = err.split("(run `")[1].split("`")[0]
    assert carried in hint, err
    argv = shlex.split(hint)[1:]
    code, out, err = run_cli(*argv, "--tokens", "64", "--vocab", "128", "--no-ladder",
                             "--no-report", "--out", str(tmp_path / "run"))  # fmt: skip
    # The sweep runs the kernel: its failure is the case's row, not a flag refusal.
    assert code == 0 and "error" in out and "--hidden" not in err, (code, out, err)


# -- N3: `memprobe attribute step.pickle --vocab 32000` on a profiled step read at medium
# confidence ended "pass --vocab/--tokens/--batch to settle it": it asked for the flag the
# user had just passed. The line names only the shape flags not given (and all three
# given settle it: confidence "given", no line).

MEDIUM_STEP = (
    "import torch\n"
    "import torch.nn.functional as F\n"
    "def step(device):\n"
    "    w = torch.randn(256, 32, device=device, requires_grad=True)\n"
    "    h = torch.randn(1, 64, 32, device=device)\n"
    "    ids = torch.randint(0, 256, (1, 64), device=device)\n"
    "    F.cross_entropy((h @ w.t()).float().view(-1, 256), ids.view(-1)).backward()\n"
)
SETTLE = {
    "nothing given": ([], "pass --vocab/--tokens/--batch to settle it"),
    "vocab given": (["--vocab", "256"], "pass --tokens/--batch to settle it"),
    "tokens given": (["--tokens", "64"], "pass --vocab/--batch to settle it"),
    "vocab and tokens": (["--vocab", "256", "--tokens", "64"], "pass --batch to settle it"),
    "all three": (["--vocab", "256", "--tokens", "64", "--batch", "1"], None),
}


@pytest.fixture(scope="module")
def medium_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return profiled(tmp_path_factory.mktemp("r28_medium"), "r28_medium_step", MEDIUM_STEP)


@pytest.mark.parametrize("flags,line", list(SETTLE.values()), ids=list(SETTLE))
def test_settle_hint_names_only_the_flags_not_given(
    run_cli: Any, medium_snapshot: Path, flags: list[str], line: str | None
) -> None:
    code, out, err = run_cli("attribute", str(medium_snapshot), "--top", "1", *flags)
    assert code == 0, err
    settle = [s.strip() for s in out.splitlines() if "to settle it" in s]
    if line is None:
        assert not settle and "confidence given" in out, out
    else:
        assert settle == [line], out
