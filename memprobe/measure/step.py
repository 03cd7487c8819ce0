"""The logits protocol's step pieces, shared by every backend: its inputs, the kernel
call (vocabulary shards under torchrun) and the process group a distributed kernel needs.
:mod:`memprobe.measure.protocol` puts them behind the input protocol object.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from memprobe.errors import UserError
from memprobe.io.text import exception_text, printable
from memprobe.kernels import get_spec
from memprobe.kernels.user import is_import_path, user_code
from memprobe.measure.parallel import RankLayout, fake_process_group
from memprobe.records import Case, torch_dtype_name

# The sweep measures the filtered kernel with a typical sampling setting;
# with no filters it would only repeat `unchunked`.
SWEEP_FILTERS: dict[str, dict[str, Any]] = {
    name: {"top_k": 50, "top_p": 0.9} for name in ("filtered", "filtered_chunked")
}


@dataclass
class StepInputs:
    logits: torch.Tensor
    targets: torch.Tensor
    grad_outputs: torch.Tensor


def torch_dtype(name: str) -> torch.dtype:
    """memprobe's dtype name (``"bf16"``) → the torch dtype, where tensors are made."""
    return getattr(torch, torch_dtype_name(name))


def make_inputs(
    case: Case, device: str, *, seed: int = 0, layout: RankLayout | None = None
) -> StepInputs:
    """Logits (a leaf that requires grad), targets and the upstream gradient.

    In a torchrun sweep each rank draws its own logits shard, while the
    targets (global token ids) and upstream gradient are the same on every
    rank of one token shard, as in a real tensor-parallel job.
    """
    shape = (case.batch, case.local_tokens, case.local_vocab)
    dtype = torch_dtype(case.dtype)
    if device == "meta":
        logits = torch.empty(shape, dtype=dtype, device="meta")
        targets = torch.empty(shape[:2], dtype=torch.long, device="meta")
        grad_outputs = torch.empty(shape[:2], dtype=torch.float32, device="meta")
        return StepInputs(logits.requires_grad_(), targets, grad_outputs)
    rank, token_shard = (layout.rank, layout.cp_rank) if layout else (0, 0)
    gen = torch.Generator(device=device).manual_seed(seed + 1000 * token_shard)
    targets = torch.randint(0, case.vocab, shape[:2], generator=gen, device=device)
    grad_outputs = torch.randn(shape[:2], generator=gen, device=device)
    gen.manual_seed(seed + 1_000_003 * (rank + 1))
    # Drawn in their own dtype: a float32 draw cast down would hold a float32
    # [B,S,V] staging tensor during setup, above the step itself for chunked kernels.
    logits = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    return StepInputs(logits.requires_grad_(), targets, grad_outputs)


def kernel_call(
    case: Case, *, whole_vocab: bool = False, layout: RankLayout | None = None
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The case's kernel as ``f(logits, targets)``. Under torchrun a vocabulary-parallel
    kernel gets this rank's shard; ``whole_vocab`` runs it on this rank alone over
    the whole vocabulary instead (a one-rank check inside a multi-rank job)."""
    spec = get_spec(case.kernel)
    extra: dict[str, Any] = dict(SWEEP_FILTERS.get(case.kernel, {}))
    if spec.distributed and layout is not None and whole_vocab:
        extra.update(group=layout.solo_group, vocab_start=0, vocab_end=case.vocab)
    elif spec.distributed and layout is not None:
        start = layout.tp_rank * case.local_vocab
        extra.update(group=layout.tp_group, vocab_start=start, vocab_end=start + case.local_vocab)

    def call(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # A kernel's sys.exit() (or another BaseException) would end the whole sweep or
        # plan with its code and no word: it is this case's error (UserCodeExit), as any
        # other exception the kernel raises.
        grad_from = logits.requires_grad  # as given: the kernel may turn it off
        before = versions((logits,))
        with user_code(case.kernel):
            out = spec.fn(logits, targets, chunk_size=case.chunk_size, **extra)
        refuse_written(case.kernel, (("logits", logits),), before)
        return checked_output(out, targets, grad_from=grad_from)

    return call


def kernel_backward(kernel: str) -> contextlib.AbstractContextManager[None]:
    """Around the backward of a graph ``kernel`` made: its backward is the kernel's code as
    much as its forward (a custom autograd Function's ``backward``, a hook it put on its
    input). Run bare, a ``sys.exit()`` there ended a sweep, plan or --what-if with the
    kernel's own status and no word, and a ``GeneratorExit`` in a traceback; under the
    forward's guards it is that case's error (or the command's one line), as in forward.
    In memprobe's torch state, as backward ran before this guard (the state a kernel's
    module set as it was imported is its forward's): swapped in, a module that turned on
    anomaly detection failed every backward on meta in anomaly mode's NaN check
    (``.item()`` of a meta tensor), and the kernel's row was an error."""
    return user_code(kernel, part="'s backward", its_state=False)


def checked_output(out: object, targets: torch.Tensor, *, grad_from: bool = False) -> torch.Tensor:
    """A kernel's result, if it is one log-prob per target: a floating tensor of the
    targets' shape, on their device and, where ``grad_from`` (an input it was given
    required grad as it was called), computed from its inputs under autograd. Anything
    else (the whole log-softmax, a tuple, a NumPy array) would be measured as another
    kernel's memory, or fail deep in autograd with no word why."""
    want = list(targets.shape)
    if not isinstance(out, torch.Tensor):
        raise BadResult(f"the kernel returned {type(out).__name__}, not a tensor of shape {want}")
    refuse_answering_subclass(out, "the kernel returned")
    out = plain_tensor(out)
    try:
        _check_result(out, targets, want, grad_from)
    except (BadResult, UnseenResult):
        raise
    except Exception as exc:
        # A tensor subclass's (or a mock's) properties are the kernel's code: one whose
        # .shape raised, or whose __torch_function__ refuses every call, failed `step`
        # with a line that blamed the model's config ("check the config's sizes").
        raise BadResult(
            f"the kernel returned a {type(out).__name__} memprobe cannot read "
            f"({exception_text(exc, limit=200)}); a kernel returns a plain tensor of shape {want}"
        ) from None
    return out


def plain_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as torch's own tensor (the same storage and graph) when its type is a
    subclass of the user's (not torch's own: a Parameter, a DTensor). Such a subclass's
    properties and methods are the kernel's code: a shape, device, grad_fn or
    untyped_storage() that lied passed a result computed in another thread (its forward
    never counted: 80 KiB, status ok, where unchunked's is 112 KiB) or blamed the wrong
    fault, and a backward that gave a zero gradient whose .double() answered the true one
    was checked against float64 with max |error| 0.0."""
    users = any(
        issubclass(cls, torch.Tensor) and not cls.__module__.startswith("torch")
        for cls in type(tensor).__mro__
    )
    return torch.Tensor.as_subclass(tensor, torch.Tensor) if users else tensor


def refuse_answering_subclass(tensor: torch.Tensor, what: str) -> None:
    """Refuse a tensor of a subclass that answers torch's calls itself (its own
    ``__torch_function__`` or ``__torch_dispatch__``): memprobe reads a result's shape, and
    its values and its gradient's against float64, through those calls. A kernel that
    returned zeros as such a subclass, ``.item()`` answering 0.0, had its row read ok with
    max |error| 0.0 forward and backward; so did one whose backward gave its gradient so."""
    answering = [
        cls.__name__
        for cls in type(tensor).__mro__
        if issubclass(cls, torch.Tensor)
        and not cls.__module__.startswith("torch")  # torch's own (a Parameter, a DTensor)
        and ("__torch_function__" in vars(cls) or "__torch_dispatch__" in vars(cls))
    ]
    if answering:
        raise BadResult(
            f"{what} a {printable(type(tensor).__name__)[:100]}, a torch.Tensor subclass with "
            "its own __torch_function__ or __torch_dispatch__: memprobe cannot read its shape "
            "or its values (against float64) but through that code, which answers for it: "
            "return a plain tensor (t.as_subclass(torch.Tensor))"
        )


def _check_result(
    out: torch.Tensor, targets: torch.Tensor, want: list[int], grad_from: bool
) -> None:
    if list(out.shape) != want or not out.is_floating_point():
        raise BadResult(
            f"the kernel returned a {str(out.dtype).removeprefix('torch.')} tensor of shape "
            f"{list(out.shape)}; a kernel returns one floating log-prob per target, shape {want}"
        )
    _check_graph(out, targets, grad_from)
    _check_seen(out)


def _check_graph(out: torch.Tensor, targets: torch.Tensor, grad_from: bool) -> None:
    """A result memprobe cannot run backward through, or whose backward is not the
    kernel's: made on another device (``torch.zeros(shape)`` without ``device=``),
    detached (``.detach()``, ``torch.no_grad()``) or a fresh leaf (a Parameter,
    ``requires_grad=True``). Each failed its case with torch's words from deep inside
    autograd ("element 0 of tensors does not require grad", "appears to not have been
    used in the graph", a meta tensor's "Cannot copy out"), naming neither the kernel's
    result nor what to change."""
    if out.device != targets.device:
        raise BadResult(
            f"the kernel returned a tensor on {out.device}, its inputs are on "
            f"{targets.device}: a kernel returns its log-probs on its inputs' device"
        )
    if not (grad_from and torch.is_grad_enabled()):
        return  # nothing will run backward: any result will do
    if not out.requires_grad:
        raise BadResult(
            "the kernel's result does not require grad (it was detached, computed under "
            "torch.no_grad(), or its inputs' requires_grad turned off): memprobe runs "
            "backward through it, so compute the log-probs from the inputs under autograd"
        )
    if out.grad_fn is None:
        raise BadResult(
            "the kernel's result is a leaf (a Parameter, or made with requires_grad=True), "
            "not computed from the kernel's inputs: its backward would reach none of them, "
            "so compute the log-probs from the inputs under autograd"
        )


def _check_seen(out: torch.Tensor) -> None:
    """The allocation tracker sees the thread that calls the kernel, and only it (torch's
    dispatch modes are per thread): a kernel that computed its result in a thread of its
    own (a ThreadPoolExecutor) was measured without its forward, in a sweep (160 KiB where
    it holds 224 KiB, status ok), a plan, a --what-if ("saves 293 KiB") and a step alike.
    Its result is then a storage the tracker never saw allocated nor was given as an
    input; so is one the kernel kept from an earlier call."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from memprobe.measure.tracker import AllocationTracker

    trackers = [m for m in _get_current_dispatch_mode_stack() if isinstance(m, AllocationTracker)]
    if trackers and out.untyped_storage().nbytes() and not trackers[-1].saw(out):
        raise UnseenResult(
            "the kernel's result was allocated where memprobe cannot see it (in another "
            "thread, or kept from an earlier call), so its memory cannot be counted: "
            "compute it in the thread that calls the kernel"
        )


# What identifies a tensor's contents: its version counter, and its place in memory.
Mark = tuple[int, tuple[int, ...], tuple[int, ...], int, int]


def versions(tensors: tuple[torch.Tensor, ...]) -> tuple[Mark, ...]:
    """Each tensor's version counter (torch bumps it at every in-place write, on meta too,
    and through a custom Function's saved copy of it) and its shape, strides, offset and
    storage: ``logits.data = logits.data[:, :, :1]`` swaps those in and bumps no version,
    and a kernel that did so was measured on a 128th of its logits (17 KiB where it holds
    112 KiB, status ok) and recommended by plan."""
    return tuple(
        (t._version, tuple(t.shape), t.stride(), int(t.storage_offset()), _storage(t))
        for t in tensors
    )


def _storage(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage (0 for a tensor without one of its own)."""
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):
        return 0


def refuse_written(
    kernel: str, inputs: tuple[tuple[str, torch.Tensor], ...], before: tuple[Mark, ...]
) -> None:
    """Refuse a kernel that wrote into the inputs it differentiates (``(label, tensor)``,
    their :func:`versions` ``before`` it ran) without ``memprobe_consumes_logits``, or gave
    them other data (``.data =``, ``set_``, ``resize_``). A user kernel
    that wrote its gradient into the logits in backward (as ``local_chunked_inplace``
    does), or zeroed them under ``no_grad()`` after its forward, was measured as one that
    keeps them: its floor counted a gradient it never holds and the answer named it
    "Keeping the logits intact" (or the lowest peak with no word that it consumes them).
    A training step that reads its logits or hidden states after the loss then reads the
    gradient instead."""
    spec = get_spec(kernel)
    after = versions(tuple(t for _, t in inputs))
    pairs = list(zip(inputs, after, before, strict=True))
    moved = [label for (label, _), a, b in pairs if a[1:] != b[1:]]
    if moved:
        raise BadResult(
            f"the kernel gave its {' and '.join(moved)} other data (`.data =`, set_ or "
            "resize_), so what memprobe measured is not its work on the inputs it was "
            "given: compute on those as given, or on a copy"
        )
    written = [label for (label, _), a, b in pairs if a != b]
    if not written or (spec.consumes_logits and written == ["logits"]):
        return
    if written == ["logits"]:
        raise BadResult(
            "the kernel wrote into its logits (an in-place op on them, in forward or "
            "backward), so they are not intact after it: if it consumes them, set "
            "fn.memprobe_consumes_logits = True; else write into a copy"
        )
    raise BadResult(
        f"the kernel wrote into its {' and '.join(written)} (an in-place op, in forward or "
        "backward): a training step reads its inputs after the loss, so write into a copy"
    )


class BadResult(ValueError):
    """A kernel's result that is not one log-prob per target memprobe can run backward
    through (:func:`checked_output`): a case's error in a sweep; in `step`, the kernel's
    own one line, not a hint that blames the model's config."""


class UnseenResult(RuntimeError):
    """A kernel's result the allocation tracker never saw allocated (:func:`_check_seen`):
    a case's error in a sweep; the step's own one line, not meta's hint, in `step`."""


def failure_text(exc: Exception, *, limit: int, first_line: bool = False) -> str:
    """A kernel's failure on one line: ``Type: message`` for what its code raised, and
    memprobe's own sentence alone for a result that breaks the contract (the class name
    ``BadResult`` in a case's note or a plan's line said nothing to the user)."""
    own = isinstance(exc, (BadResult, UnseenResult))
    return exception_text(exc, limit=limit, first_line=first_line, name=not own)


def kernel_failed(
    kernel: str, tokens: str, exc: Exception, *, hidden: int | None = None
) -> UserError:
    """The one line for a kernel that raised in a meta simulation outside a sweep (a plan,
    a what-if), where there is no case row to record it in: which kernel, at what size.
    A hidden-family kernel's sweep needs ``--hidden`` (without it the sweep refuses the
    kernel before it runs), so the suggested command carries it."""
    what = failure_text(exc, limit=300)
    flags = "" if hidden is None else f" --hidden {hidden}"
    return UserError(
        f"{kernel} failed in the meta simulation at {tokens} ({what})",
        f"run `memprobe sweep --kernel {kernel}{flags} --device meta` at a small size to see it",
    )


def _blamed_on_kernel(kernel: str, device: torch.device) -> bool:
    """Whether a model step's failure inside ``kernel`` is that kernel's one line: a
    user's kernel on meta. memprobe's own kernels, or a real device: the step's own line."""
    return is_import_path(kernel) and device.type == "meta"


def own_failures(kernel: str, fn: Any, device: torch.device) -> Any:
    """``fn`` (the kernel of a model's step), whose exceptions on meta, where a user's
    kernel raised them, are that kernel's one line (:func:`kernel_failed`): the step's
    line blamed the model built from config.json ("check the config's sizes") for a
    ``requires_grad_(False)`` or a ``ValueError`` of the user's own kernel."""
    if not _blamed_on_kernel(kernel, device):
        return fn

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            # Its sys.exit() is its own too: the step's line said "the step called
            # sys.exit(3) ... remove the exit", of memprobe's own step.
            with user_code(kernel):
                return fn(*args, **kwargs)
        except (UserError, BadResult, UnseenResult):
            raise
        except Exception as exc:
            # Three positional inputs are the hidden family's (hidden [B,S,H], weight, targets).
            hidden = int(args[0].shape[-1]) if len(args) == 3 else None
            raise kernel_failed(kernel, f"{args[-1].numel():,} tokens", exc, hidden=hidden) from exc

    return call


@contextlib.contextmanager
def own_backward_failures(
    kernel: str, device: torch.device, reached: list[bool], tokens: int
) -> Iterator[None]:
    """Around a model step's backward, as :func:`own_failures` around its kernel: what
    failed before the backward ``reached`` the kernel's input ran in the kernel's own
    backward (a custom Function's, a hook it set), and is that kernel's one line. The
    step's line blamed the model ("check the config's sizes"), or "the step" for an exit."""
    if not _blamed_on_kernel(kernel, device):
        yield
        return
    try:
        with kernel_backward(kernel):
            yield
    except (UserError, BadResult, UnseenResult):
        raise
    except Exception as exc:
        if reached:
            raise  # the model's backward, after the kernel's was done
        raise kernel_failed(kernel, f"{tokens:,} tokens", exc) from exc


def process_group_for(case: Case) -> contextlib.AbstractContextManager[object]:
    """A vocabulary-parallel kernel needs a process group. Under torchrun the
    real one is already there; elsewhere a fake group of ``case.tp`` ranks
    stands in, whose collectives do nothing: exact for memory, and exact for
    values too when tp is 1."""
    if not get_spec(case.kernel).distributed or dist.is_initialized():
        return contextlib.nullcontext()
    return fake_process_group(case.tp)


def describe_filters(case: Case) -> str:
    extra = SWEEP_FILTERS.get(case.kernel)
    return ", ".join(f"{k}={v}" for k, v in extra.items()) if extra else ""
