"""Per-probe progress of a plan search: every count tried is heard with its peak and
whether it fits; it shows in the live bar on a terminal only, and stdout, ``--json`` and
stderr off a terminal stay as they were."""

from __future__ import annotations

import io
import json

import pytest

from memprobe.plan import ALLOCATED, RESERVED, PlanRequest, Probe, make_budget, run_plan_job
from memprobe.render.console import Progress
from memprobe.render.plan_text import probe_line, probe_progress

ONE = PlanRequest(vocab=4096, budget="40MiB", kernels=("unchunked",))
PLAN = ("plan", "--vocab", "4096", "--budget", "40MiB", "--kernel", "unchunked,local_chunked")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("jobs", [1, 2])
def test_every_probe_is_heard_with_its_verdict(jobs: int) -> None:
    heard: list[Probe] = []
    request = PlanRequest(
        vocab=4096, budget="40MiB", kernels=("unchunked", "local_chunked"), jobs=jobs
    )
    outcome = run_plan_job(request, on_probe=heard.append)
    limit = make_budget("40MiB").limit_bytes
    assert {p.kind for p in heard} == {ALLOCATED, RESERVED}
    assert all(p.limit == limit and p.fits == (p.peak <= limit) for p in heard)
    for plan in outcome.plans:
        mine = {(p.kind, p.tokens): p for p in heard if p.target == plan.target}
        # Each search's evidence is what was heard: T fits, T + 1 does not.
        assert len(mine) == plan.allocated.simulations + (plan.reserved.simulations or 0)
        t = plan.allocated.max_tokens
        assert mine[(ALLOCATED, t)].fits and not mine[(ALLOCATED, t + 1)].fits
        assert mine[(ALLOCATED, t)].peak == plan.allocated.peak_at_max


def test_a_probe_reads_as_one_line() -> None:
    heard: list[Probe] = []
    run_plan_job(ONE, None, heard.append)
    fits = next(p for p in heard if p.fits)
    over = next(p for p in heard if not p.fits)
    assert probe_line(fits).startswith(f"unchunked tp=1 cp=1: {fits.tokens:,} tokens/GPU -> ")
    assert probe_line(fits).endswith(f"{fits.kind}, fits 40.00 MiB")
    assert probe_line(over, "tokens/sequence").endswith(f"{over.kind}, over 40.00 MiB")
    assert " tokens/sequence -> " in probe_line(over, "tokens/sequence")


@pytest.mark.parametrize(("stream", "shown"), [(_Tty(), True), (io.StringIO(), False)])
def test_probes_show_on_a_terminal_only(stream: io.StringIO, shown: bool) -> None:
    progress = Progress(stream)
    heard: list[Probe] = []

    def both(p: Probe) -> None:
        heard.append(p)
        probe_progress(progress)(p)

    try:
        run_plan_job(ONE, None, both)
    finally:
        progress.close()
    assert (probe_line(heard[-1]) in stream.getvalue()) is shown
    assert shown or stream.getvalue() == ""


def test_plan_output_is_unchanged_off_a_terminal(run_cli) -> None:
    code, out, err = run_cli(*PLAN)
    assert code == 0, err
    # Off a terminal stderr has the per-plan lines only, stdout the table.
    assert [line.split("]")[0] for line in err.splitlines()] == ["[1/2", "[2/2"]
    assert " -> " not in err and " -> " not in out
    code, out, err = run_cli(*PLAN, "--json")
    assert code == 0
    assert [row["kernel"] for row in json.loads(out)] == ["unchunked", "local_chunked"]


class _Traced:
    """A whole step's trace, made up: its peak grows by 1 KiB per token."""

    def __init__(self, tokens: int) -> None:
        self.peak_bytes, self.events, self.phase_peaks = 1024 * tokens + 4096, tokens, {}


def test_plan_step_hears_each_whole_step_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from memprobe.plan import whole_step
    from memprobe.profile.hf import HFStep, config_from_dict

    # The search and its progress, without tracing a model: the peaks are a line.
    monkeypatch.setattr(whole_step, "trace_hf_step", lambda s: (_Traced(s.tokens), None))
    monkeypatch.setattr(whole_step, "modelled_reserved_peak", lambda n, _: 1024 * n + 8192)
    config = {
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": 512,
    }  # fmt: skip
    base = HFStep(config_from_dict(config), tokens=1, chunk_size=32, optimizer="sgd")
    heard: list[Probe] = []
    budget = make_budget("1MiB")
    (plan,) = whole_step.plan_step(base, ["unchunked"], budget, on_probe=heard.append)
    allocated = {p.tokens: p for p in heard if p.kind == ALLOCATED}
    reserved = {p.tokens: p for p in heard if p.kind == RESERVED}
    assert allocated.keys() == reserved.keys()  # one trace gives both peaks
    assert len(heard) == 2 * len(allocated)  # each count traced once
    assert plan.allocated.max_tokens == (budget.limit_bytes - 4096) // 1024
    t = plan.allocated.max_tokens
    assert allocated[t].fits and not allocated[t + 1].fits
    assert reserved[t].peak == 1024 * t + 8192
