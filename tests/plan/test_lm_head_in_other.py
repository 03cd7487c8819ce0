"""``plan --hidden`` says the step holds the lm_head weight (and its gradient), and
``--other-includes-lm-head`` gives the weight back when --other already holds it."""

from __future__ import annotations

import json

import pytest

from memprobe import plan
from memprobe.errors import UserError
from memprobe.measure.meta_backend import simulate_tracker
from memprobe.measure.protocol import hidden_shape

BASE = ["plan", "--no-reserved", "--jobs", "1", "--budget", "96MiB"]


@pytest.mark.parametrize(
    ("kernel", "vocab", "hidden", "dtype"),
    [
        ("linear_unchunked", 4096, 64, "bf16"),
        ("fused_linear_chunked", 4096, 128, "fp32"),
        ("linear_local_chunked", 8192, 32, "fp16"),
    ],
)
def test_the_weight_given_back_is_the_one_the_step_holds(kernel, vocab, hidden, dtype):
    target = plan.PlanTarget(kernel, vocab, dtype=dtype, chunk_size=256, hidden=hidden)
    case = target.case(512)
    assert target.lm_head_bytes == hidden_shape(case).weight_bytes
    tracker = simulate_tracker(case, capture_frames=False)
    weights = [e for e in tracker.events if e.op == "input: weight" and e.action == "alloc"]
    assert [e.nbytes for e in weights] == [target.lm_head_bytes]
    # Giving the weight back plans exactly as an --other without it would.
    weight = target.lm_head_bytes
    assert weight is not None
    given = plan.with_lm_head_in_other(plan.make_budget("96MiB", 40 * 2**20), [target])
    without = plan.make_budget("96MiB", 40 * 2**20 - weight)
    assert given.limit_bytes == without.limit_bytes
    assert plan.max_tokens(target, given) == plan.max_tokens(target, without)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--vocab", "4096", "--other-includes-lm-head"], "is for --hidden plans"),
        (
            ["--vocab", "4096", "--hidden", "4096", "--other", "1MiB", "--other-includes-lm-head"],
            "cannot include the lm_head weight: it alone is 32.00 MiB",
        ),
    ],
)
def test_bad_uses_are_one_line(run_cli, args, says):
    code, out, err = run_cli(*BASE, *args)
    assert code == 2 and out == ""
    assert says in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("extra", "note", "budget"),
    [
        ([], "keep the weight out of --other, or pass --other-includes-lm-head", "= 88.00 MiB"),
        (
            ["--other-includes-lm-head"],
            "(512.00 KiB) is in --other and in the step, so it is given back once",
            "- other 8.00 MiB + lm_head weight in both 512.00 KiB = 88.50 MiB",
        ),
    ],
)
def test_hidden_plans_say_what_the_step_counts(run_cli, extra, note, budget):
    args = ["--vocab", "4096", "--hidden", "64", "--kernel", "linear_unchunked"]
    code, out, err = run_cli(*BASE, *args, "--other", "8MiB", *extra)
    assert code == 0, err
    assert budget in out.splitlines()[0]
    (line,) = [x for x in out.splitlines() if x.startswith("lm_head: ")]
    assert note in line
    code, out, _ = run_cli(*BASE, *args, "--other", "8MiB", *extra, "--json")
    (row,) = json.loads(out)
    assert row.get("other_in_step_bytes") == (512 * 1024 if extra else None)
    assert row["limit_bytes"] == 88 * 2**20 + (512 * 1024 if extra else 0)


def test_logits_plans_have_no_lm_head_note(run_cli):
    code, out, _ = run_cli(*BASE, "--vocab", "2048", "--kernel", "unchunked")
    assert code == 0 and "lm_head" not in out


def test_the_library_refuses_mixed_targets():
    targets = [
        plan.PlanTarget("linear_unchunked", 4096, hidden=64),
        plan.PlanTarget("unchunked", 4096),
    ]
    with pytest.raises(UserError, match="is for --hidden plans"):
        plan.with_lm_head_in_other(plan.make_budget("1GiB", "1MiB"), targets)
