"""The loss step of a snapshot made with one of memprobe's own kernels, found by its frames.

A chunked kernel (``local_chunked``, ``local_tiled``, ...) never materializes ``[N, V]``
float32 blocks, so the logits family alone does not show where its step lies. Its blocks
are made under the kernel's custom autograd Function, whose Python frames are in
``memprobe/kernels/``: the step's forward runs from the first to the last block made
there in forward, its backward from the first block made there in backward to the last,
and the logits' gradient is the block of the logits' size among them. The shape comes
from memprobe's label on that gradient (``[B, S, V]``), else from attribution's reading
(or ``--vocab/--tokens/--batch``).
"""

from __future__ import annotations

import math

from memprobe.allocator.snapshot_format import ALLOC
from memprobe.attribute.findings import Findings
from memprobe.attribute.loss_step_record import LossStep, refuse_an_oom_inside
from memprobe.attribute.sites import Phases, SiteCache
from memprobe.errors import UserError
from memprobe.io.sizes import format_bytes
from memprobe.records import normalize_dtype
from memprobe.snapshot.replay import BEFORE_TRACE, Replay, ReplayBlock

_KERNELS_DIR = "memprobe/kernels/"
_ITEMSIZE_NAMES = {4: "float32", 2: "bfloat16"}


# Kernel modules whose step --what-if cannot swap: they take the hidden states and the
# lm_head weight (the lm_head is inside them), or one rank's vocabulary shard.
_HIDDEN_MODULES = frozenset({"fused_linear", "linear_unfused", "torch_linear_ce"})
_PARALLEL_MODULES = frozenset({"distributed"})


def kernel_files(entry: dict[str, object]) -> list[str]:
    """The memprobe kernel modules (``local_chunked``) in ``entry``'s stack, innermost first."""
    frames = entry.get("frames")
    if not isinstance(frames, list):
        return []
    out: list[str] = []
    for frame in frames:
        # Only a string names a file: str() of what a file holds instead raised past
        # Python's 4,300 digits (an int) or its recursion limit (a deep list), a traceback.
        filename = frame.get("filename") if isinstance(frame, dict) else None
        name = filename.replace("\\", "/") if isinstance(filename, str) else ""
        at = name.rfind(_KERNELS_DIR)
        if at >= 0 and name.endswith(".py"):
            out.append(name[at + len(_KERNELS_DIR) : -3])
    return out


def kernel_file(entry: dict[str, object]) -> str | None:
    """The memprobe kernel module (``local_chunked``) whose frames made ``entry``, if any."""
    files = kernel_files(entry)
    return files[0] if files else None


def own_kernel_step(
    found: Findings, rep: Replay, sites: SiteCache, phases: Phases
) -> LossStep | None:
    """The step of a memprobe kernel that ran forward and backward in the trace; None when
    no memprobe kernel's backward made blocks there (see the module notes)."""
    entries = rep.entries
    forward: list[int] = []
    backward: list[int] = []
    names: set[str] = set()
    outer: set[str] = set()
    for pos, e in enumerate(entries):
        if e["action"] != ALLOC:
            continue
        files = kernel_files(e)
        if not files:
            continue
        name = files[0]
        outer.update(files)
        phase = phases.phase(pos)
        if phase == "forward":
            forward.append(pos)
        elif phase == "backward":
            backward.append(pos)
        else:
            continue
        names.add(name)
    if not forward or not backward:
        return None
    kernel = ", ".join(sorted(names))
    if outer & _HIDDEN_MODULES:
        raise UserError(
            f"the step's loss is memprobe's {', '.join(sorted(outer & _HIDDEN_MODULES))}, "
            "which takes the hidden states and the lm_head weight: --what-if swaps a loss "
            "on the logits",
            "profile the step with a logits kernel (e.g. local_chunked) to compare kernels",
        )
    if outer & _PARALLEL_MODULES:
        raise UserError(
            "the step's loss is memprobe's vocabulary-parallel kernel: --what-if swaps a "
            "single-device loss",
            "profile the step with one rank's whole vocabulary",
        )
    if len(names) > 1 or forward[-1] > backward[0]:
        raise UserError(
            f"the trace holds several loss steps of memprobe's kernels ({kernel}): "
            "--what-if cuts exactly one",
            "record a single training step (memprobe profile, or a shorter history)",
        )
    fs, fe = forward[0], forward[-1]
    bs, be = backward[0], backward[-1]
    blocks = [b for b in rep.blocks if b.alloc_pos != BEFORE_TRACE]
    live_at_start = {
        b.size: b
        for b in sorted(blocks, key=lambda b: b.alloc_pos)
        if b.alloc_pos < fs and b.live_at(fs)
    }
    made = [b for b in blocks if bs <= b.alloc_pos <= be and b.size in live_at_start]
    if not made:
        raise UserError(
            f"{kernel}'s backward made no block of the logits' size (it writes the "
            "gradient into the logits' buffer): nothing marks where its step ends",
            "profile the step with a kernel that makes the logits' gradient (e.g. local_chunked)",
        )
    # The logits' gradient has the logits' dtype and shape. Where memprobe's labels say
    # so, a block that only shares their size is not it: the float32 chunk of a bf16 step
    # at S <= chunk is twice the logits, as large as an embedding [V, H=2S] live before
    # the step, and was taken for the gradient of that weight ("logits" of float32).
    fitting = [b for b in made if _labels_agree(sites, b, live_at_start[b.size])]
    gradient = max(fitting or made, key=lambda b: b.size)
    logits = live_at_start[gradient.size]
    refuse_an_oom_inside(rep, bs, gradient, kernel)
    site = sites.site(gradient.alloc_entry) if gradient.alloc_entry is not None else None
    shape = site.label_shape if site is not None else None
    shapes = found.inference
    if shape is not None and len(shape) == 3:
        batch, seq, vocab = shape
    elif shapes.known and shapes.tokens and shapes.vocab:
        batch = shapes.batch if shapes.batch and shapes.tokens % shapes.batch == 0 else 1
        seq, vocab = shapes.tokens // batch, shapes.vocab
    else:
        raise UserError(
            f"{kernel}'s step is in the trace, but the logits' shape is not: its gradient "
            f"is {format_bytes(gradient.size)}, with no [B, S, V] recorded",
            "give it with --vocab, --tokens and --batch",
        )
    elements = batch * seq * vocab
    itemsize = gradient.size // elements if elements else 0
    torch_name = (site.label_dtype if site is not None else None) or _ITEMSIZE_NAMES.get(itemsize)
    dtype = normalize_dtype(torch_name) if torch_name else None
    if dtype is None or gradient.size != elements * itemsize:
        raise UserError(
            f"the logits' gradient ({format_bytes(gradient.size)}) is not [B={batch:,}, "
            f"S={seq:,}, V={vocab:,}] in a 16- or 32-bit dtype",
            "give the shape with --vocab, --tokens and --batch",
        )
    cut = tuple(b for b in blocks if fs <= b.alloc_pos <= fe or bs <= b.alloc_pos <= be)
    return LossStep(
        forward=(fs, fe),
        backward=(bs, be),
        logits=logits,
        gradient=gradient,
        cut=cut,
        batch=batch,
        rows=seq,
        vocab=vocab,
        dtype=dtype,
        torch_dtype=torch_name or dtype,
    )


def _labels_agree(sites: SiteCache, made: ReplayBlock, live: ReplayBlock) -> bool:
    """Whether memprobe's labels (dtype and element count) of a block made in backward and of the
    live block of its size agree, as a gradient's and its tensor's do; True where either
    has no label (a real CUDA snapshot's blocks)."""
    labels = []
    for b in (made, live):
        site = sites.site(b.alloc_entry) if b.alloc_entry is not None else None
        if site is None or site.label_dtype is None or site.label_shape is None:
            return True
        # Elements, not the shape: the lm_head's [B·S, V] is viewed as [B, S, V].
        labels.append((site.label_dtype, math.prod(site.label_shape)))
    return labels[0] == labels[1]
