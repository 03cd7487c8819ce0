"""What an allocation's op, autograd node and frames say about its role in a training step.

Provenance decides what a block is; its size only says what it could be. A block is on
the *logits path* when the code that made it is the lm_head matmul, a softmax / loss
over the vocabulary, or their backward nodes. Names are matched loosely (aten ops,
autograd nodes, torch functions, user functions) because real stacks use all of them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from memprobe.attribute.frames import is_cpp, is_internal, normalized_path
from memprobe.records import Frame

# Words that name a computation over the vocabulary dimension. "logprob" catches the
# user's own log-prob functions (and memprobe's kernels); matched on lower case with
# underscores removed, so ``LogSoftmaxBackward0`` and ``log_softmax`` both hit.
_LOSS_WORDS = ("softmax", "logsumexp", "crossentropy", "nllloss", "logprob", "lmhead", "logits")
_MATMUL = re.compile(r"(?:^|[.:_])(linear|mm|addmm|matmul|bmm|baddbmm|einsum)(?:\b|_|$)")
# Integer results: indices, counts, masks. A [B,S,V]-sized integer block is never logits.
# Copies: ``logits.float()``, HF's ``logits[:, :-1].contiguous()``.
_COPY = re.compile(r"(?:^|[.:_])(clone|contiguous|_to_copy|copy|to)(?:\b|_|$)")
_INT_OPS = re.compile(r"arange|randint|argmax|argmin|nonzero|one_hot|topk|sort|bincount|cumsum")
_OPTIMIZER_NAMES = frozenset(
    {"step", "_multi_tensor_adam", "_single_tensor_adam", "_fused_adam", "adam", "adamw", "sgd"}
)
_PARAM_SETUP = frozenset({"_apply", "to", "cuda", "reset_parameters", "_init_weights", "__init__"})


def _squash(text: str | None) -> str:
    return (text or "").lower().replace("_", "")


def is_loss_name(text: str | None) -> bool:
    squashed = _squash(text)
    return any(w in squashed for w in _LOSS_WORDS)


def is_matmul(op: str | None, node: str | None) -> bool:
    """A matmul forward (the lm_head is one); its backward makes weight/hidden grads."""
    if node is not None:
        return False
    return bool(op and _MATMUL.search(op.lower().removeprefix("aten::")))


def is_opaque_generated(op: str | None, via: Sequence[str]) -> bool:
    """A buffer torch.compile's generated code allocated with no op named: its fused
    kernels and matmuls write into it (the lm_head's output among them)."""
    return op is None and any(v.startswith("generated") for v in via)


def is_copy(op: str | None) -> bool:
    return bool(op and _COPY.search(op.lower().removeprefix("aten::")))


def is_int_op(op: str | None) -> bool:
    return bool(op and _INT_OPS.search(op.lower()))


def loss_evidence(op: str | None, node: str | None, frames: Sequence[Frame]) -> str | None:
    """Why this allocation is part of a softmax/loss over the vocabulary, or None.

    Checked: the op, the autograd node, and the innermost Python frame and innermost
    user frame (``cross_entropy_loss`` in the user's training.py). Outer frames are
    not: a ``compute_loss`` that calls the whole model would claim every activation.
    """
    if is_int_op(op) or in_attention(frames):
        return None
    if is_loss_name(op):
        return f"op {op}"
    if is_loss_name(node):
        return f"autograd node {node}"
    innermost_py = next((f for f in frames if not is_cpp(f)), None)
    innermost_user = next((f for f in frames if not is_internal(f)), None)
    for frame in (innermost_py, innermost_user):
        if frame is not None and is_loss_name(frame.name):
            return f"made in {frame.name}()"
    return None


def in_attention(frames: Sequence[Frame]) -> bool:
    """The softmax inside attention is over [B, h, S, S], not over the vocabulary."""
    return any(_attention_frame(f) for f in frames)


@functools.lru_cache(maxsize=1 << 16)
def _attention_frame(frame: Frame) -> bool:
    name = frame.name.lower()
    return not is_cpp(frame) and ("attention" in name or "attn" in name)


# Collectives and tensor-parallel layers: on the logits path they mean each rank holds
# a shard of the vocabulary (Megatron's vocab-parallel cross entropy all_reduces its max).
_COLLECTIVE_WORDS = ("allreduce", "allgather", "reducescatter", "vocabparallel",
                     "columnparallel", "tensorparallel")  # fmt: skip


def collective_evidence(frames: Sequence[Frame]) -> str | None:
    """The frame name that says a collective / vocab-parallel layer made this, or None."""
    for frame in frames:
        name = _squash(frame.name)
        path = _squash(normalized_path(frame.filename))
        if any(w in name or w in path for w in _COLLECTIVE_WORDS):
            return frame.name
    return None


def is_optimizer(frames: Sequence[Frame]) -> bool:
    """Under torch.optim (any subclass of Optimizer runs its step through it) or a step
    function of a known optimizer implementation."""
    return any(_optimizer_frame(f) for f in frames)


@functools.lru_cache(maxsize=1 << 16)
def _optimizer_frame(frame: Frame) -> bool:
    if is_cpp(frame):
        return False
    path = normalized_path(frame.filename)
    if "/torch/optim/" in path:
        return True
    return frame.name in _OPTIMIZER_NAMES and "optim" in path


def is_zero_grad(frames: Sequence[Frame]) -> bool:
    return any(f.name == "zero_grad" for f in frames if not is_cpp(f))


def is_autotune(frames: Sequence[Frame]) -> bool:
    """Buffers triton's autotuner allocates to benchmark kernel configurations."""
    return any(_autotune_frame(f) for f in frames)


@functools.lru_cache(maxsize=1 << 16)
def _autotune_frame(frame: Frame) -> bool:
    if is_cpp(frame):
        return False
    path = normalized_path(frame.filename)
    return ("/triton/" in path or "/_inductor/" in path) and (
        "autotune" in path or "bench" in frame.name or "autotune" in frame.name
    )


def is_parameter_setup(frames: Sequence[Frame]) -> bool:
    """Made while a module was built or moved to the device (``model.to('cuda')``)."""
    for frame in frames:
        if is_cpp(frame):
            continue
        if frame.name in _PARAM_SETUP and "/torch/nn/modules/" in normalized_path(frame.filename):
            return True
        if frame.name in ("reset_parameters", "_init_weights"):
            return True
    return False


# Ops whose output shape names a dimension of the step directly. ``ones_like`` and
# ``full_like`` copy another tensor's shape and name none: autograd's seed gradient
# (``loss.backward()`` makes ``ones_like(loss)``, 4 bytes) is no [2, 2] mask.
_POSITIONS = re.compile(r"(?:^|[.:_])arange(?:\b|_|$)")
_MASKS = re.compile(r"(?:^|[.:_])(triu|tril|ones|full|new_ones|new_full)(?!_like)(?:\b|_|$)")
_ROTARY = re.compile(r"(?:^|[.:_])(cos|sin|polar)(?:\b|_|$)")


def shape_op(op: str | None) -> str | None:
    """``"arange"`` (positions), ``"mask"`` (a mask's constructor) or ``"rotary"`` (its
    tables) for an op that makes those, else None."""
    if not op:
        return None
    name = op.lower().removeprefix("aten::")
    if _POSITIONS.search(name):
        return "arange"
    if _MASKS.search(name):
        return "mask"
    if _ROTARY.search(name):
        return "rotary"
    return None


_ID_MAKERS = re.compile(
    r"(?:^|[.:_])(empty|empty_strided|randint|arange|to|_to_copy|copy|clone|contiguous|cat|"
    r"slice|index|index_select|repeat|expand|new_empty|full|zeros|ones)(?:\b|_|$)"
)


def may_hold_ids(op: str | None) -> bool:
    """Whether ``op`` can make an int64 block of token ids or targets (a copy from the
    host, an index, an empty buffer); a norm, a sum or a matmul cannot."""
    return op is None or is_int_op(op) or bool(_ID_MAKERS.search(op.lower().removeprefix("aten::")))


def is_cast(op: str | None) -> bool:
    """A dtype conversion (``aten::_to_copy``): autocast's weight copies are these."""
    if not op:
        return False
    return op.lower().removeprefix("aten::").removeprefix("aten.") in (
        "_to_copy",
        "to",
        "_to_copy.default",
    )


def is_autocast_cast(frames: Sequence[Frame]) -> bool:
    """Made by autocast's cast of an operand (``at::autocast::cached_cast`` in the C++
    stack): its cached bfloat16 copy of a weight, whatever op allocated the storage."""
    return any(f.name.startswith("at::autocast::cached_cast") for f in frames)


def is_checkpoint(frames: Sequence[Frame]) -> bool:
    """Under ``torch.utils.checkpoint`` (forward of a checkpointed segment, or its
    recomputation in backward)."""
    return any(
        not is_cpp(f) and "/torch/utils/checkpoint" in normalized_path(f.filename) for f in frames
    )


_COMM_BUFFER = re.compile(r"c10d::|Reducer::|ProcessGroupNCCL|/torch/distributed/|nccl", re.I)


def is_comm_buffer(frames: Sequence[Frame]) -> bool:
    """DDP's gradient buckets (``c10d::Reducer``), FSDP's flat parameters and NCCL's
    buffers: made by the distributed machinery itself."""
    return any(_COMM_BUFFER.search(f.name) or _COMM_BUFFER.search(f.filename) for f in frames)
