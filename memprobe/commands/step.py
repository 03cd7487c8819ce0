"""``memprobe step --config CONFIG``: a Hugging Face causal LM's whole training step,
simulated on meta from its config alone: the peak (allocated, and reserved by the
allocator model), what it is made of and the log-prob step's share. torch and
transformers are imported only when it runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from memprobe.commands import sharded_flags as sharded
from memprobe.commands.flags import MAX_COUNT, answer, runs_torch, user_errors, warn_on_size
from memprobe.errors import UserError
from memprobe.io.files import check_output_file, guard_outputs
from memprobe.io.sizes import format_bytes, parse_budget
from memprobe.io.text import printable

if TYPE_CHECKING:
    from memprobe.plan import Budget, TokenPlan
    from memprobe.profile.hf import HFStep


def build_step(
    config: str | os.PathLike[str],
    *,
    tokens: int,
    batch: int = 1,
    kernel: str | None = None,
    fused: bool = False,
    chunk_size: int = 1024,
    checkpointing: bool = False,
    optimizer: str = "adamw",
    dtype: str = "bf16",
    param_dtype: str | None = None,
    attn: str = "auto",
    sharding: Any = None,
    mp_param: str | None = None,
) -> Any:
    """The checked :class:`memprobe.profile.hf.HFStep` the flags describe; with an active
    ``sharding`` (:func:`memprobe.profile.sharded.sharding_from_flags`), the sharded step."""
    from memprobe.profile.hf import HFStep, load_config

    if fused and kernel is not None:
        raise UserError(
            "--fused and --kernel both name the log-prob kernel",
            "--fused is --kernel fused_linear_chunked; give one of them",
        )
    cls: Any = HFStep
    extra: dict[str, Any] = {}
    fsdp = sharding is not None and sharding.shard_ranks > 1
    if mp_param is not None and not fsdp:
        raise UserError("--mp-param is FSDP2's", "add --fsdp N, or use --dtype")
    if sharding is not None and sharding.active:
        from memprobe.profile.sharded import ShardedHFStep, sharded_dtypes

        dtype, param_dtype = sharded_dtypes(dtype, param_dtype, mp_param)
        cls, extra = ShardedHFStep, {"sharding": sharding}
    return cls(
        load_config(config),
        tokens=tokens,
        batch=batch,
        kernel="fused_linear_chunked" if fused else (kernel or default_kernel(sharding)),
        chunk_size=chunk_size,
        checkpointing=checkpointing,
        optimizer=optimizer,
        dtype=dtype,
        param_dtype=param_dtype,
        attn=attn,
        **extra,
    )


def default_kernel(sharding: Any) -> str:
    """The log-prob kernel when none is named: the chunked one, vocabulary-parallel under
    tensor parallel (the lm_head's logits are sharded on the vocabulary)."""
    return "chunked_distributed" if sharding is not None and sharding.tp > 1 else "local_chunked"


def _count(n: int) -> str:
    """``8.05B``, ``124.44M``, or the count itself below a million (a toy model's 69,888
    parameters are not "0.00B")."""
    if n >= 10**9:
        return f"{n / 1e9:,.2f}B"
    return f"{n / 1e6:,.2f}M" if n >= 10**6 else f"{n:,}"


# How profile.hf builds each optimizer, as the step's header says it: --optimizer sgd is SGD with
# momentum (one state buffer per parameter), which the header said as "sgd" alone, and a
# user of plain SGD (no state) read its state bytes as SGD's.
OPTIMIZER_WORDS = {"adamw": "adamw", "sgd": "sgd (momentum 0.9)", "none": "none"}


def step_lines(result: Any, settings: str | None = None) -> list[str]:
    """What ``memprobe step`` prints for a :class:`memprobe.profile.step.StepResult`
    (``settings``: the allocator settings modelled, where they are not torch's defaults)."""
    r = result
    peak = r.peak_allocated_bytes
    lines = [
        f"{r.model_type}, {_count(r.parameters)} parameters: {r.batch} x {r.tokens:,} tokens, "
        f"{r.dtype} (parameters {r.param_dtype}), kernel {r.kernel}, "
        f"checkpointing {'on' if r.checkpointing else 'off'}, "
        f"optimizer {OPTIMIZER_WORDS.get(r.optimizer, r.optimizer)}",
        f"attention: {r.attention_words}",
        *sharded_lines(r.sharded),
        f"peak allocated {format_bytes(peak)}, reserved {format_bytes(r.peak_reserved_bytes)} "
        f"(allocator model{f' with {settings}' if settings else ''}), in the {r.peak_phase} "
        "phase",
        "peak by phase: "
        + ", ".join(
            f"{phase} {format_bytes(nbytes)}"
            for phase, nbytes in r.phase_peaks.items()
            if phase != "setup"
        ),
        "at the peak:",
    ]
    for category, nbytes in sorted(r.bytes_by_category.items(), key=lambda kv: -kv[1]):
        share = nbytes / peak if peak else 0.0
        lines.append(f"  {category:<26} {format_bytes(nbytes):>12}  {share:6.1%}")
    lines.append(
        f"logprob step: {format_bytes(r.logprob_bytes)} at the peak ({r.logprob_share:.1%}); "
        f"its own working set {format_bytes(r.logprob_working_bytes)}"
    )
    if r.budget_bytes is not None:
        fits_alloc, fits_res = r.fits("allocated"), r.fits("reserved")
        verdict = "fits" if fits_res else ("fits allocated only" if fits_alloc else "does not fit")
        lines.append(
            f"budget {format_bytes(r.budget_bytes)}: {verdict} "
            f"(reserved {format_bytes(r.peak_reserved_bytes)}, allocated {format_bytes(peak)})"
        )
    return lines


def sharded_lines(sharded: dict[str, Any] | None) -> list[str]:
    """The sharded step's layout and its per-rank parameter arithmetic (none unsharded)."""
    if not sharded:
        return []
    s = sharded
    n, tp = s["shard_ranks"], s["tp"]
    layout = [f"FSDP {s['fsdp']}"] if s["fsdp"] > 1 or s["cp"] > 1 or tp == 1 else []
    layout += [f"CP {s['cp']}"] if s["cp"] > 1 else []
    layout += [f"TP {tp}"] if tp > 1 else []
    sequence = f": a {s['sequence_tokens']:,}-token sequence" if s["cp"] > 1 else ""
    if n > 1:
        mp = ", ".join(
            f"{k} {s[k] or 'as is'}" for k in ("mp_param", "mp_reduce", "mp_output")
        ).replace("_", "-")
        fsdp = (
            f"FSDP2 shards over {n} ranks, reshard after forward "
            f"{'on' if s['reshard_after_forward'] else 'off'}; {mp}"
        )
    else:
        fsdp = "no FSDP: the parameters tp does not split are whole on every rank"
    lines = [f"sharded: rank 0 of {s['world']} ({' x '.join(layout)}{sequence}); {fsdp}"]
    if tp > 1:
        whole = {k: v * tp for k, v in s["tp_per_rank"].items()}
        lines.append(
            f"tensor parallel {tp}, per rank: "
            + ", ".join(f"{v:,} of {whole[k]:,} {k}" for k, v in s["tp_per_rank"].items())
            + " (embedding and norms not split)"
        )
        split = f"{format_bytes(s['even_split_parameter_bytes'])} (projections and lm_head / {tp}"
        split += f", all / {n} FSDP)" if n > 1 else ", the rest whole)"
    else:
        split = f"{format_bytes(s['unsharded_parameter_bytes'])} / {n}"
    lines.append(
        f"parameters per rank {format_bytes(s['rank_parameter_bytes'])} = {split} + "
        f"{format_bytes(s['padding_bytes'])} padding (gradients and optimizer state alike)"
    )
    return lines


def step_command(
    config: str | os.PathLike[str],
    *,
    tokens: int,
    budget: str | None = None,
    out: str | os.PathLike[str] | None = None,
    as_json: bool = False,
    alloc_conf: str | None = None,
    **step_flags: Any,
) -> str:
    """Simulate the step; write the snapshot to ``out`` when given; return the text."""
    from memprobe.allocator import alloc_conf_setting, modelled_alloc_conf, settings_words
    from memprobe.allocator.config import refuse_fraction_under_budget

    warn_on_size(budget, "--budget")  # `--budget 80` (bytes) or 80GB, as sweep and plan warn
    budget_bytes = parse_budget(budget) if budget is not None else None
    setting = alloc_conf_setting(alloc_conf)  # else the environment's, as sweep
    conf = modelled_alloc_conf(*setting) if setting is not None else None
    if budget_bytes is not None:
        refuse_fraction_under_budget(setting, budget_bytes)
    from memprobe.kernels.user_sources import kernel_source_files, loaded_code_files

    source = Path(config) / "config.json" if Path(config).is_dir() else Path(config)
    sources = [source, *kernel_source_files(step_flags.get("kernel"))]
    guard_outputs({"--out": out}, [*sources, *loaded_code_files([out])])
    if out is not None:
        check_output_file(out, what="snapshot")
    step = build_step(config, tokens=tokens, **step_flags)
    from memprobe.profile.step import simulate_step

    result = simulate_step(
        step, budget_bytes=budget_bytes, alloc_conf=conf, capture_frames=out is not None
    )
    if out is not None:
        from memprobe.snapshot.synthesize import synthesize_snapshot
        from memprobe.snapshot.write import write_snapshot

        # A module the kernel imported as it ran is code too: never replaced.
        guard_outputs({"--out": out}, loaded_code_files([out]))

        snapshot = synthesize_snapshot(result.events, conf=conf, clock="simulation")
        snapshot["memprobe"]["device"] = "meta"
        snapshot["memprobe"]["step"] = f"memprobe step --config {config}"
        write_snapshot(snapshot, out)
    if as_json:
        return json.dumps(result.row(), indent=1)
    lines = step_lines(result, settings_words(setting) if setting is not None else None)
    if out is not None:
        lines.append(f"wrote {printable(str(out))}")
    return "\n".join(lines)


HELP = """A Hugging Face model's whole training step, simulated on meta from its config: the
peak, what it is made of, and the log-prob step's share."""


@user_errors
@runs_torch
def command(
    config: Annotated[
        Path, typer.Option(help="The model's config.json, or the directory holding it.")
    ],
    tokens: Annotated[int, typer.Option(min=1, max=MAX_COUNT, help="Tokens per sequence.")],
    batch: Annotated[int, typer.Option(min=1, max=MAX_COUNT, help="Sequences per GPU.")] = 1,
    kernel: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="The log-prob kernel (`memprobe kernels`). (default: local_chunked)"),
    ] = None,
    fused: Annotated[
        bool,
        typer.Option(
            help="The fused hidden->logprob route (fused_linear_chunked on the final hidden "
            "states and the lm_head weight): no logits."
        ),
    ] = False,
    chunk_size: Annotated[
        int, typer.Option(min=1, max=MAX_COUNT, help="The kernel's chunk size.")
    ] = 1024,
    checkpointing: Annotated[
        bool, typer.Option(help="Activation (gradient) checkpointing of every layer.")
    ] = False,
    optimizer: Annotated[
        str, typer.Option(help="adamw, sgd (with momentum 0.9) or none.")
    ] = "adamw",
    dtype: Annotated[str, typer.Option(help="What the model computes in: bf16, fp16, fp32.")] = (
        "bf16"
    ),
    param_dtype: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Parameters' dtype: as --dtype, or fp32 (float32 master weights)."),
    ] = None,
    attn: Annotated[
        str,
        typer.Option(
            help="auto: SDPA with the kernel CUDA picks (flash / memory-efficient), eager "
            "where the architecture has no SDPA; sdpa-math: SDPA's math path; eager: the "
            "model's matmul + softmax."
        ),
    ] = "auto",
    budget: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Memory of one GPU, e.g. 80GiB: says whether the step fits."),
    ] = None,
    alloc_conf: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Allocator settings for the reserved model (PYTORCH_ALLOC_CONF)."),
    ] = None,
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Write the CUDA-format snapshot here (open it with attribute)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    fsdp: sharded.FsdpOption = 1,
    cp: sharded.CpOption = 1,
    tp: sharded.TpOption = 1,
    reshard_after_forward: sharded.ReshardOption = "true",
    mp_param: sharded.MpParamOption = None,
    mp_reduce: sharded.MpReduceOption = None,
    mp_output: sharded.MpOutputOption = None,
) -> None:
    answer(
        step_command(
            config,
            tokens=tokens,
            batch=batch,
            kernel=kernel,
            fused=fused,
            chunk_size=chunk_size,
            checkpointing=checkpointing,
            optimizer=optimizer,
            dtype=dtype,
            param_dtype=param_dtype,
            attn=attn,
            budget=budget,
            alloc_conf=alloc_conf,
            out=out,
            as_json=as_json,
            **sharded.sharded_flags(
                fsdp=fsdp,
                cp=cp,
                tp=tp,
                reshard_after_forward=reshard_after_forward,
                mp_param=mp_param,
                mp_reduce=mp_reduce,
                mp_output=mp_output,
            ),
        )
    )


def plan_step_lines(
    config: Path | None,
    *,
    budget: str,
    kernel: str | None,
    batch: int,
    dtype: str,
    chunk_size: str | None,
    checkpointing: bool,
    optimizer: str,
    alloc_conf: str | None,
    reserved: bool,
    as_json: bool,
    step: bool,
    **sharded: Any,
) -> list[str]:
    """``memprobe plan --step --config CONFIG``: the plan table for the whole step."""
    from memprobe.allocator import alloc_conf_setting, modelled_alloc_conf, settings_words
    from memprobe.allocator.config import refuse_fraction_under_budget
    from memprobe.commands.flags import name_list, positive_ints

    if not step or config is None:
        raise UserError("--step and --config go together", "e.g. --step --config config.json")
    chunk = positive_ints(chunk_size, "--chunk-size") if chunk_size is not None else [1024]
    if len(chunk) != 1:
        raise UserError("--step plans one chunk size", "e.g. --chunk-size 1024")
    from memprobe import plan
    from memprobe.plan.whole_step import step_kernels
    from memprobe.render.console import plain_lines
    from memprobe.render.plan_text import answer_line, plan_table

    limit = plan.make_budget(parse_budget(budget))
    # --alloc-conf, else the environment's (as sweep); none read with --no-reserved.
    setting = alloc_conf_setting(alloc_conf) if reserved else None
    conf = modelled_alloc_conf(*setting) if setting is not None else None
    refuse_fraction_under_budget(setting, limit.budget_bytes)
    base = build_step(
        config,
        tokens=1,
        batch=batch,
        chunk_size=chunk[0],
        checkpointing=checkpointing,
        optimizer=optimizer,
        dtype=dtype,
        **sharded,
    )
    kernels = (
        name_list(kernel, "--kernel")
        if kernel is not None
        else step_kernels(
            vocab_parallel=base.vocab_shards > 1,
            hidden=base.hidden_route_simulated,
        )
    )
    for name in kernels:  # every name checked before the first simulation
        build_step(config, tokens=1, kernel=name, dtype=dtype, **sharded)
    plans = _plan_with_progress(base, kernels, limit, reserved=reserved, alloc_conf=conf)
    if as_json:
        return [json.dumps([p.row() for p in plans], indent=1)]
    what = (
        f"whole training step of {base.config.model_type} (batch {batch}, {dtype}, "
        f"checkpointing {'on' if checkpointing else 'off'}, "
        f"optimizer {OPTIMIZER_WORDS.get(optimizer, optimizer)}): "
        "tokens per sequence"
    )
    layout = base.sharded_summary()
    if layout:  # the sharded step: per rank, the tokens each GPU holds (of each sequence)
        per = "tokens per GPU" if batch == 1 else "tokens per sequence on each GPU"
        what = what.replace("tokens per sequence", per) + (
            f"; sharded: rank 0 of {layout['world']}, FSDP {layout['fsdp']} x CP "
            f"{layout['cp']} x TP {layout['tp']} (the table's tp/cp columns are the logprob "
            "kernel's own: the vocabulary shards of its logits, and 1: it sees this rank's "
            "tokens)"
        )
    where = "reserved in the last column" if reserved else "reserved not planned: --no-reserved"
    if setting is not None:
        where += f", allocator model with {settings_words(setting)}"
    head = f"budget {format_bytes(limit.budget_bytes)} for the whole step (allocated peak; {where})"
    return [head, what, *plain_lines(plan_table(plans)), answer_line(plans, limit)]


def _plan_with_progress(
    base: HFStep, kernels: list[str], limit: Budget, **kw: Any
) -> list[TokenPlan]:
    """:func:`memprobe.plan.whole_step.plan_step`, saying on stderr as it goes: each
    kernel's answer when it is found (a line each off a terminal), and each whole step
    traced in the live bar on a terminal (one takes seconds to minutes)."""
    from memprobe.plan.whole_step import plan_step
    from memprobe.render.console import Progress
    from memprobe.render.plan_text import probe_progress

    progress = Progress()
    finished = 0
    # The same unit as the header: a sharded step's count is what each GPU holds, of
    # each of --batch sequences (not "/GPU" at --batch 2, half of what the GPU holds).
    unit = "tokens/GPU" if base.sharded_summary() and base.batch == 1 else "tokens/sequence"

    def on_done(done: TokenPlan) -> None:
        nonlocal finished
        finished += 1
        progress.step(finished, len(kernels), f"{done.target.kernel}: {done.max_tokens:,} {unit}")

    try:
        return plan_step(
            base, kernels, limit, on_done=on_done, on_probe=probe_progress(progress, unit), **kw
        )
    finally:
        progress.close()
