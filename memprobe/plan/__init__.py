"""The planner: the largest token count per GPU whose simulated peak fits a budget.

One facade over the package's concerns, each in its own module:

* :mod:`~memprobe.plan.model` — the records: :class:`PlanTarget` (one kernel on one
  layout, checked when made), :class:`Budget`, the fitted :class:`Line`, a
  :class:`Search`'s evidence and the :class:`TokenPlan` answer;
* :mod:`~memprobe.plan.search` — the pure search (asks for peaks, runs nothing);
* :mod:`~memprobe.plan.driver` — runs many searches on the meta simulation the
  sweep uses, in order or in a process pool;
* :mod:`~memprobe.plan.targets` — which targets a plan covers;
* :mod:`~memprobe.plan.chunks` — the chunk size to pick, from memory and measured times;
* :mod:`~memprobe.plan.message` — what the plan says beside its table;
* :mod:`~memprobe.plan.job` — the job ``memprobe plan`` runs (a request's targets, planned).

From Python::

    from memprobe.plan import PlanTarget, make_budget, max_tokens
    max_tokens(PlanTarget("local_chunked", vocab=131072), make_budget("80GiB", "54GiB"))
"""

from __future__ import annotations

from memprobe.errors import UserError
from memprobe.plan.chunks import ChunkChoice, chunk_choices
from memprobe.plan.driver import run_plans, simulated_peak
from memprobe.plan.job import PlanOutcome, PlanRequest, budget_from, run_plan_job
from memprobe.plan.message import lm_head_status, reserved_status
from memprobe.plan.model import (
    ALLOCATED,
    RESERVED,
    Budget,
    Line,
    OnProbe,
    PlanTarget,
    Probe,
    Search,
    TokenPlan,
    make_budget,
    with_lm_head_in_other,
)
from memprobe.plan.other import OtherFit, fit_other, other_from_snapshots
from memprobe.plan.search import search_max_tokens, seed_tokens
from memprobe.plan.targets import default_kernels, plan_targets


def plan_one(
    target: PlanTarget, budget: Budget, *, alloc_conf: str | None = None, reserved: bool = True
) -> TokenPlan:
    """The whole answer for one target (see :class:`TokenPlan`); ``reserved`` False skips
    the search on the modelled reserved peak."""
    return run_plans([target], budget, alloc_conf=alloc_conf, reserved=reserved)[0]


def max_tokens(target: PlanTarget, budget: Budget) -> int:
    """The largest token count per GPU (each rank's share of the sequence) whose simulated
    allocated peak fits ``budget − other``; 0 when not even one token fits."""
    # The allocated answer alone: no reserved search to throw away.
    return plan_one(target, budget, reserved=False).max_tokens


def fits(target: PlanTarget, tokens: int, budget: Budget) -> bool:
    """Whether ``tokens`` per GPU fit ``budget − other`` on the simulated allocated peak:
    one simulation, no search."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise UserError(f"tokens must be a whole number of zero or more, got {tokens!r}", "")
    if tokens == 0:
        return True
    peak = simulated_peak(target.case(tokens)) + budget.other_growth(target, tokens)
    return peak <= budget.limit_bytes


__all__ = [
    "ALLOCATED",
    "RESERVED",
    "Budget",
    "ChunkChoice",
    "Line",
    "PlanOutcome",
    "PlanRequest",
    "OnProbe",
    "OtherFit",
    "PlanTarget",
    "Probe",
    "Search",
    "TokenPlan",
    "chunk_choices",
    "default_kernels",
    "budget_from",
    "fit_other",
    "fits",
    "make_budget",
    "max_tokens",
    "other_from_snapshots",
    "plan_one",
    "plan_targets",
    "lm_head_status",
    "reserved_status",
    "run_plan_job",
    "run_plans",
    "search_max_tokens",
    "seed_tokens",
    "simulated_peak",
    "with_lm_head_in_other",
]
