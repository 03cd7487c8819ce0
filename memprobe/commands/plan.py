"""``memprobe plan``: how many tokens per GPU fit a memory budget, per kernel × layout.

The command parses flags, runs the plan job (:func:`memprobe.plan.run_plan_job`)
and renders it: progress on stderr, the page with ``--out``, the table and the answer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from memprobe.commands import sharded_flags as sharded
from memprobe.commands.flags import (
    MAX_COUNT,
    CpOption,
    TpOption,
    answer,
    grouped_number,
    int_list,
    name_list,
    positive_ints,
    runs_torch,
    user_errors,
    warn_on_size,
)
from memprobe.errors import UserError
from memprobe.io.sizes import parse_budget
from memprobe.io.text import printable

if TYPE_CHECKING:
    from memprobe.plan import PlanRequest
    from memprobe.render.console import Progress


def _progress(progress: Progress) -> Callable[[int, int, Any], None]:
    """Report each finished plan on stderr: some take minutes (torch's chunk loop at a
    million tokens), and the table comes only when all are done."""

    def on_plan(i: int, n: int, done: Any) -> None:
        from memprobe.render.plan_text import count_unit

        # --batch 2 searches tokens per sequence, as the table's column says: not "/GPU".
        t = done.target
        unit = count_unit(t.batch)
        progress.step(i, n, f"{t.kernel} tp={t.tp} cp={t.cp}: {done.max_tokens:,} {unit}")

    return on_plan


def _check_out(out: Path, request: PlanRequest) -> None:
    """``--out`` is a folder for plan.html, plan.png and plan.json, none of them an input
    (the --from-run run, the --other-from snapshots)."""
    from memprobe.io.files import check_output_file, guard_outputs
    from memprobe.render.html import refuse_foreign
    from memprobe.render.plan_page import PLAN_FILE_WHAT, PLAN_FILES
    from memprobe.results import run_inputs

    # The folder, or the nearest part of its path that exists, must be a folder.
    there = next((p for p in (out, *out.parents) if p.exists()), None)
    if there is not None and not there.is_dir():
        where = "is a file" if there == out else f"is under {there}, a file"
        raise UserError(
            f"--out {out} {where}, not a folder",
            "name a folder for plan.html, plan.png and plan.json",
        )
    inputs = [*(run_inputs(request.from_run) if request.from_run else []),
              *map(Path, request.other_from)]  # fmt: skip
    guard_outputs({f"--out {name}": out / name for name in PLAN_FILES}, inputs)
    for name, what in zip(PLAN_FILES, PLAN_FILE_WHAT, strict=True):
        check_output_file(out / name, what=what)
    # As the report's: a plan.html, plan.png or plan.json of the user's own is not replaced.
    refuse_foreign([out / name for name in PLAN_FILES], writer="plan")


def _single(text: str, flag: str, example: str) -> int:
    values = positive_ints(text, flag, example=example)
    if len(values) != 1:
        # "151,936" is one number written with separators, not a first value to keep.
        grouped = grouped_number(text)
        hint = f"for the number write {flag} {grouped}" if grouped else f"e.g. {flag} {values[0]}"
        raise UserError(f"{flag} takes one value, got {text!r}", hint)
    return values[0]


HELP = """The largest token count per GPU whose simulated peak fits BUDGET - OTHER.

For every kernel x parallel layout, found by bisection on the exact meta
simulation the sweep uses, seeded by the line peak = slope x tokens + fixed.
Peaks are allocated bytes on one rank.
"""


@user_errors
@runs_torch
def command(
    vocab: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Vocabulary size (one value), e.g. 131072. (--step: the config's)"),
    ] = None,
    *,
    budget: Annotated[
        str, typer.Option(help="Memory of one GPU, e.g. 80GiB (B, KB/MB/GB/TB, KiB/MiB/GiB/TiB).")
    ],
    other: Annotated[
        str,
        typer.Option(
            help="What the rest of the job holds on that GPU (weights, optimizer...); "
            "with --hidden, not the lm_head weight (see --other-includes-lm-head)."
        ),
    ] = "0",
    other_from: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Read --other from CUDA snapshots of the whole step, comma list: one gives "
            "a constant, two or more at different token counts a constant + per-token fit."
        ),
    ] = None,
    dtype: Annotated[str, typer.Option(help="Logits dtype: bf16, fp16 or fp32.")] = "bf16",
    batch: Annotated[str, typer.Option(help="Sequences per GPU (one value).")] = "1",
    kernel: Annotated[
        Optional[str],  # noqa: UP045 - typer needs Optional on py3.10
        typer.Option(
            help="Kernels, comma list (`memprobe kernels`). "
            "(default: as the sweep: single-device ones, vocabulary-parallel ones with --tp)"
        ),
    ] = None,
    chunk_size: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Chunk sizes to compare for chunked kernels, comma list. "
            "(default: those --from-run timed, else 1024)"
        ),
    ] = None,
    tp: TpOption = "1",
    cp: CpOption = "1",
    hidden: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=1,
            max=MAX_COUNT,
            help="Hidden size H: plan the hidden family (lm_head fused or not with the "
            "log-prob; hidden [B,S,H], weight [V,H] and both gradients count in the peak: "
            "keep the weight out of --other, or see --other-includes-lm-head).",
        ),
    ] = None,
    other_includes_lm_head: Annotated[
        bool,
        typer.Option(
            "--other-includes-lm-head",
            help="With --hidden: --other already holds the lm_head weight [V,H]; give it "
            "back so it counts once (its gradient stays: the step makes it).",
        ),
    ] = False,
    alloc_conf: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Caching-allocator settings (PYTORCH_ALLOC_CONF syntax) for the allocator "
            "model's reserved answer, e.g. expandable_segments:True."
        ),
    ] = None,
    from_run: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="A cpu/cuda sweep's run directory: its times pick a chunk size."),
    ] = None,
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Directory for plan.html, plan.png and plan.json."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the plans as a JSON list of rows.")
    ] = False,
    reserved: Annotated[
        bool,
        typer.Option(
            help="Also find the tokens that fit on the allocator model's reserved peak "
            "(about 2-4x the simulations); --no-reserved plans on allocated bytes only."
        ),
    ] = True,
    jobs: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            help="Simulation processes (forked; helps where cores are free; at most the "
            "cores here). (default: 1)"
        ),
    ] = None,
    step: Annotated[
        bool,
        typer.Option(
            "--step",
            help="Plan the whole training step of --config's model (`memprobe step`); "
            "--fsdp, --cp and --tp (one value each) shard it over ranks.",
        ),
    ] = False,
    config: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="--step: the model's config.json, or the directory holding it."),
    ] = None,
    checkpointing: Annotated[
        bool, typer.Option(help="--step: activation checkpointing of every layer.")
    ] = False,
    optimizer: Annotated[
        str, typer.Option(help="--step: adamw, sgd (with momentum 0.9) or none.")
    ] = "adamw",
    fsdp: sharded.FsdpOption = 1,
    reshard_after_forward: sharded.ReshardOption = "true",
    mp_param: sharded.PlanMpParamOption = None,
    mp_reduce: sharded.MpReduceOption = None,
    mp_output: sharded.MpOutputOption = None,
) -> None:
    from memprobe.plan import PlanRequest, run_plan_job
    from memprobe.render.console import show
    from memprobe.render.plan_text import (
        answer_line,
        budget_line,
        chunk_lines,
        line_note,
        plan_table,
    )

    if jobs is not None and jobs < 1:
        raise UserError(f"--jobs {jobs} must be 1 or more", "e.g. --jobs 2")
    warn_on_size(budget, "--budget")
    warn_on_size(other, "--other")
    parse_budget(budget)  # nothing fits in a zero budget: said before any simulation
    if alloc_conf is not None and alloc_conf.strip() and not reserved:
        # The settings shape the reserved answer alone: with it off, they were read, checked
        # and dropped, the plan printed as if they had been applied.
        raise UserError(
            "--alloc-conf sets the allocator model of the reserved answer, which "
            "--no-reserved turns off",
            "drop --no-reserved to plan the reserved peak under these settings, or drop "
            "--alloc-conf",
        )
    fsdp_flags: dict[str, Any] = {
        "reshard_after_forward": reshard_after_forward,
        "mp_param": mp_param,
        "mp_reduce": mp_reduce,
        "mp_output": mp_output,
    }
    if config is not None and not step:
        # Said first: a flag the whole step does not take was refused "for --config (a
        # whole-step plan)", and once dropped, the plan said --step was missing.
        raise UserError(
            "--config names the model of a whole-step plan, which --step asks for",
            "add --step, or drop --config",
        )
    if step:
        from memprobe.commands.step import plan_step_lines

        # Given, these would be silently ignored; each is refused with its own reason
        # (all were "the config gives the model", which --other, --out and --from-run are
        # not). (--tp/--cp/--fsdp lay the step out over ranks: sharded_flags.)
        config_gives = "the config gives the model"
        given = {
            "--vocab": (vocab is not None, config_gives),
            "--hidden": (hidden is not None, config_gives),
            "--other-includes-lm-head": (other_includes_lm_head, config_gives),
            "--other": (other.strip() != "0", "the whole step is all the GPU holds"),
            "--other-from": (other_from is not None, "the whole step is all the GPU holds"),
            "--out": (out is not None, "its page is not written for a whole-step plan yet"),
            "--from-run": (
                from_run is not None,
                "its times pick the logprob plan's chunk size only",
            ),
        }
        for flag, (used, why) in given.items():
            if used:
                raise UserError(f"{flag} does not apply to --step: {why}", f"drop {flag}")

        sharding = sharded.sharded_flags(
            fsdp=fsdp, cp=_single(cp, "--cp", "8"), tp=_single(tp, "--tp", "8"), **fsdp_flags
        )
        for line in plan_step_lines(
            config, budget=budget, kernel=kernel, batch=_single(batch, "--batch", "2"), dtype=dtype,
            chunk_size=chunk_size, checkpointing=checkpointing, optimizer=optimizer,
            alloc_conf=alloc_conf, reserved=reserved, as_json=as_json, step=step, **sharding,
        ):  # fmt: skip
            answer(line)
        return
    if fsdp != 1 or any(v not in (None, "true") for v in fsdp_flags.values()):
        raise UserError(
            "--fsdp, --reshard-after-forward and --mp-* plan the sharded whole step",
            "add --step --config CONFIG",
        )
    # Read only by the whole-step plan: without --step they would be silently ignored.
    if checkpointing or optimizer != "adamw":
        raise UserError(
            "--checkpointing and --optimizer plan the whole training step",
            "add --step --config CONFIG, or drop them",
        )
    if vocab is None:
        raise UserError("--vocab is missing", "e.g. --vocab 131072 (or --step --config CONFIG)")
    request = PlanRequest(
        vocab=_single(vocab, "--vocab", "131072"),
        budget=budget,
        other=other,
        dtype=dtype,
        batch=_single(batch, "--batch", "2"),
        kernels=None if kernel is None else tuple(name_list(kernel, "--kernel")),
        chunk_sizes=(
            tuple(int_list(chunk_size, "--chunk-size", allow_none=True))
            if chunk_size is not None
            else None
        ),
        tp=tuple(positive_ints(tp, "--tp", example="1,2,4")),
        cp=tuple(positive_ints(cp, "--cp", example="1,2,4")),
        hidden=hidden,
        alloc_conf=alloc_conf,
        from_run=from_run,
        jobs=jobs if jobs is not None else 1,
        reserved=reserved,
        other_includes_lm_head=other_includes_lm_head,
        other_from=(tuple(name_list(other_from, "--other-from")) if other_from is not None else ()),
    )
    if out is not None:
        _check_out(out, request)  # before the search: a bad --out must not cost it
    from memprobe.render.console import Progress
    from memprobe.render.plan_text import probe_progress

    progress = Progress()
    try:
        outcome = run_plan_job(request, _progress(progress), probe_progress(progress))
    finally:
        progress.close()
    written: tuple[Path, ...] = ()
    if out is not None:
        from memprobe.render.plan_page import write_plan_page

        written = write_plan_page(out, outcome.plans, outcome.budget, outcome.rows())
    if as_json:
        answer(json.dumps(outcome.rows(), indent=1))
        return
    typer.echo(budget_line(outcome.budget))
    show([plan_table(outcome.plans)])
    if outcome.skipped:
        typer.echo(f"not planned (no vocabulary shards): {', '.join(outcome.skipped)}")
    for line in [*chunk_lines(outcome.choices, timed=from_run is not None), *outcome.notes]:
        typer.echo(line)
    note = line_note(outcome.plans)
    if note:
        typer.echo(note)
    for path in written:
        typer.echo(f"wrote {printable(str(path))}")
    typer.echo(answer_line(outcome.plans, outcome.budget))
