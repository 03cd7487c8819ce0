"""The planner: max_tokens fits and max_tokens + 1 does not, on the exact simulation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memprobe
from memprobe import plan
from memprobe.errors import UserError
from memprobe.kernels import KERNELS, get_spec
from memprobe.records import Case, Run
from memprobe.results import write_results

# Small shapes keep every simulation in milliseconds; the headline test takes the real one.
VOCAB = 2048
CHUNK = 256
BUDGET = 32 * 2**20


def _layouts() -> list[tuple[str, int]]:
    out = [(name, 1) for name, spec in KERNELS.items() if spec.inputs == "logits"]
    out += [(name, 2) for name, spec in KERNELS.items() if spec.distributed]
    return out


def _run_all() -> dict[tuple[str, int], plan.TokenPlan]:
    targets = [plan.PlanTarget(k, vocab=VOCAB, chunk_size=CHUNK, tp=tp) for k, tp in _layouts()]
    plans = plan.run_plans(targets, plan.make_budget(BUDGET), reserved=False)
    return {(p.target.kernel, p.target.tp): p for p in plans}


@pytest.fixture(scope="module")
def small_plans() -> dict[tuple[str, int], plan.TokenPlan]:
    return _run_all()


@pytest.mark.parametrize(("kernel", "tp"), _layouts())
def test_max_tokens_fits_and_one_more_does_not(small_plans, kernel, tp):
    p = small_plans[(kernel, tp)]
    assert p.max_tokens > 0
    at_max = plan.simulated_peak(p.target.case(p.max_tokens))
    above = plan.simulated_peak(p.target.case(p.max_tokens + 1))
    assert at_max <= BUDGET < above
    assert (p.allocated.peak_at_max, p.allocated.peak_above) == (at_max, above)


def test_the_line_is_exact_where_the_peak_is_one_line(small_plans):
    # unchunked keeps 14 bytes per logit (bf16 logits + float32 copies) and a few per token.
    p = small_plans[("unchunked", 1)]
    per_token = plan.simulated_peak(Case("unchunked", 1, 1, VOCAB))
    assert (p.allocated.line.slope, p.allocated.line.fixed) == (per_token, 0)
    assert p.allocated.predicted == p.max_tokens == BUDGET // per_token
    assert p.row()["line_exact"] is True and p.allocated.line_error_bytes == 0
    # local_chunked's fixed term is its float32 chunk workspace: CHUNK x VOCAB x 4 bytes.
    local = small_plans[("local_chunked", 1)].allocated.line
    assert local.fixed >= CHUNK * VOCAB * 4


def test_headline_long_context_case():
    """80 GiB, 54 GiB for the rest of the model, 131,072 vocabulary (docs/plan.md)."""
    target = plan.PlanTarget("local_chunked", vocab=131072)
    budget = plan.make_budget("80GiB", "54GiB")
    best = plan.max_tokens(target, budget)
    assert best == 52223
    assert memprobe.fits(target, best, budget)
    assert not memprobe.fits(target, best + 1, budget)


@settings(max_examples=60, deadline=None)
@given(
    slope=st.integers(1, 5000),
    fixed=st.integers(0, 10**6),
    step=st.integers(0, 10**5),
    chunk=st.integers(1, 300),
    limit=st.integers(0, 10**8),
    pairs=st.booleans(),
)
def test_search_finds_the_boundary_of_any_stepped_line(slope, fixed, step, chunk, limit, pairs):
    """A peak with a jump every chunk (as naive_chunked has) still gets the exact boundary,
    asked in pairs (a pool) or one count at a time where it bisects (in order)."""

    def peak(t: int) -> int:
        return slope * t + fixed + step * (t // chunk)

    steps = plan.search_max_tokens(limit, (2 * chunk, 4 * chunk), pairs=pairs)
    ask = next(steps)
    try:
        while True:
            ask = steps.send({t: peak(t) for t in ask})
    except StopIteration as done:
        found = done.value
    top = found.max_tokens
    assert top == 0 or peak(top) <= limit
    assert peak(top + 1) > limit
    assert found.simulations < 80
    # The reserved search: a higher peak, searched below the first answer from its line.
    steps = plan.search_max_tokens(limit, (0, 0), below=top + 1, line=found.line, pairs=pairs)
    try:
        ask = next(steps)
        while True:
            ask = steps.send({t: peak(t) + step for t in ask})
    except StopIteration as done:
        below = done.value.max_tokens
    assert below <= top and (below == 0 or peak(below) + step <= limit)
    assert peak(below + 1) + step > limit


@pytest.mark.parametrize("stretch", [1, 40, 5_000, 50_000, 99_990])
def test_a_reserved_stretch_just_over_the_limit_takes_few_counts(stretch):
    """The reserved search starts at the allocated answer; where the reserved peak stays a
    little over the limit for a long stretch below it (a segment rounded up), it comes down
    in steps that double, not one token per count, and asks one count at a time where it
    bisects in order."""
    slope, limit, top = 1_000, 100_000_000, 100_000  # allocated fits up to ``top``
    boundary = top - stretch

    def reserved(t: int) -> int:
        return slope * t if t <= boundary else limit + 1 + (t - boundary) % 7

    steps = plan.search_max_tokens(
        limit, (0, 0), below=top + 1, line=plan.Line(slope, 0), pairs=False
    )
    asked = []
    ask = next(steps)
    try:
        while True:
            asked.append(ask)
            ask = steps.send({t: reserved(t) for t in ask})
    except StopIteration as done:
        found = done.value
    assert found.max_tokens == boundary
    # Galloping down, then bisecting what is left: a few rounds per doubling of the stretch.
    assert len(asked) <= 3 * (stretch.bit_length() + 2), asked
    assert found.simulations <= 2 * len(asked)


def test_nothing_fits_is_an_answer():
    p = plan.plan_one(plan.PlanTarget("unchunked", VOCAB), plan.make_budget("1GiB", "1GiB"))
    assert p.max_tokens == 0 and not p.fits_at_all and p.allocated.peak_at_max is None
    assert p.allocated.peak_above == plan.simulated_peak(Case("unchunked", 1, 1, VOCAB))


@pytest.mark.parametrize(
    ("budget", "other", "says"),
    [
        ("-1GiB", "0", "negative"),
        ("10GiB", "20GiB", "more than --budget"),
        ("lots", "0", "not a size"),
        ("10GiB", "-1", "negative"),
    ],
)
def test_bad_budgets_are_user_errors(budget, other, says):
    with pytest.raises(UserError, match=says):
        plan.make_budget(budget, other)


def test_context_parallel_reports_global_tokens():
    budget = plan.make_budget(BUDGET)
    one = plan.plan_one(plan.PlanTarget("local_chunked", VOCAB, chunk_size=CHUNK), budget)
    eight = plan.plan_one(plan.PlanTarget("local_chunked", VOCAB, chunk_size=CHUNK, cp=8), budget)
    assert eight.max_tokens == one.max_tokens  # each rank holds its share of the sequence
    assert eight.global_tokens == 8 * one.max_tokens
    assert eight.row()["global_tokens"] == eight.global_tokens


def test_targets_skip_single_device_kernels_at_tp_above_one():
    targets, skipped = plan.plan_targets(
        ["unchunked", "chunked_distributed"], vocab=VOCAB, tp=(1, 2), chunk_sizes=(128, 256)
    )
    pairs = {(t.kernel, t.tp, t.chunk_size) for t in targets}
    # unchunked ignores the chunk size: planned once, with none.
    assert pairs == {
        ("unchunked", 1, None),
        ("chunked_distributed", 1, 128),
        ("chunked_distributed", 1, 256),
        ("chunked_distributed", 2, 128),
        ("chunked_distributed", 2, 256),
    }
    assert skipped == ["unchunked at tp 2"]
    with pytest.raises(UserError, match="does not divide"):
        plan.PlanTarget("distributed", vocab=VOCAB, tp=3)
    with pytest.raises(UserError, match="shards the vocabulary"):
        plan.PlanTarget("unchunked", vocab=VOCAB, tp=2)


def test_pool_gives_the_same_answers():
    targets = [
        plan.PlanTarget(k, vocab=VOCAB, chunk_size=CHUNK) for k in ("unchunked", "local_chunked")
    ]
    budget = plan.make_budget(BUDGET)
    in_order = plan.run_plans(targets, budget, jobs=1, reserved=False)
    pooled = plan.run_plans(targets, budget, jobs=2, reserved=False)
    assert [p.row() for p in pooled] == [p.row() for p in in_order]


def test_chunk_choice_from_measured_times(tmp_path):
    targets = [plan.PlanTarget("local_chunked", vocab=VOCAB, chunk_size=c) for c in (128, 256)]
    plans = plan.run_plans(targets, plan.make_budget(BUDGET), reserved=False)
    rows = [
        Run(
            Case("local_chunked", 1, 4096, 8192, chunk_size=c, device="cpu"),
            "ok",
            peak_bytes=1 << 20,  # an ok row holds its peak (round 25 refuses one without)
            fwd_time_s=t,
            bwd_time_s=t,
        ).row()
        for c, t in ((128, 0.5), (256, 0.2), (512, 0.1))  # 512 was not planned: not chosen
    ]
    write_results(tmp_path, rows)
    from memprobe.results import read_rows

    (choice,) = plan.chunk_choices(plans, read_rows(tmp_path))
    assert (choice.for_memory, choice.for_time) == (128, 256)
    assert "measured fastest of 2 sizes" in choice.why
    (alone,) = plan.chunk_choices(plans, None)
    assert alone.for_time is None and "on memory alone" in alone.why


def test_reserved_plan_uses_the_allocator_model():
    target = plan.PlanTarget("naive_chunked", vocab=VOCAB, chunk_size=CHUNK)
    conf = "expandable_segments:True"
    (p,) = plan.run_plans([target], plan.make_budget(BUDGET), alloc_conf=conf)
    assert p.reserved is not None and 0 < p.reserved.max_tokens <= p.max_tokens
    top = p.reserved.max_tokens
    assert plan.simulated_peak(target.case(top), plan.RESERVED, conf) <= BUDGET
    assert plan.simulated_peak(target.case(top + 1), plan.RESERVED, conf) > BUDGET
    assert p.row()["reserved_max_tokens"] == top
    assert "expandable_segments:True" in plan.reserved_status((conf, None))


def test_memprobe_fits_is_loaded_on_first_use():
    # (`import memprobe` alone imports no torch: tests/test_architecture.py)
    assert memprobe.fits is plan.fits


def test_fits_checks_its_arguments():
    target = plan.PlanTarget("local_chunked", VOCAB)
    with pytest.raises(UserError):
        memprobe.fits(target, -1, plan.make_budget(BUDGET))
    assert memprobe.fits(target, 0, plan.make_budget(0))
    assert get_spec("local_chunked").uses_chunk_size


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"kernel": "nope"}, "unknown kernel"),
        ({"vocab": 0}, "vocab must be a positive integer"),
        ({"batch": True}, "batch must be a positive integer"),
        ({"cp": -1}, "cp must be a positive integer"),
        ({"chunk_size": 0}, "chunk size must be a positive integer"),
        ({"dtype": "int8"}, "unknown dtype"),
        ({"kernel": "linear_unchunked"}, "takes hidden states"),
        ({"hidden": 64}, "takes logits"),
        ({"kernel": "fused_linear_chunked", "hidden": 0}, "hidden must be a positive integer"),
    ],
)
def test_a_target_checks_itself_when_made(fields, says):
    with pytest.raises(UserError, match=says):
        plan.PlanTarget(**{"kernel": "local_chunked", "vocab": VOCAB, **fields})


def test_a_target_keeps_canonical_values():
    t = plan.PlanTarget("unchunked", VOCAB, dtype="BFloat16", chunk_size=256)
    assert (t.dtype, t.chunk_size) == ("bf16", None)  # unchunked ignores the chunk size


def test_library_calls_take_the_hidden_family():
    target = plan.PlanTarget("fused_linear_chunked", vocab=4096, hidden=256)
    budget = plan.make_budget("64MiB")
    top = plan.max_tokens(target, budget)
    assert top > 0
    assert memprobe.fits(target, top, budget)
    assert not memprobe.fits(target, top + 1, budget)
