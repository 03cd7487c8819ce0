"""The sharded step: a Hugging Face model under FSDP2, context and tensor parallel,
simulated as rank 0 of a fake world of ranks in this one process.

torch's fake process group (``backend="fake"``, the one its own distributed tests and
``MemTracker`` use) makes every collective a no-op, and ``FakeTensorMode`` makes every
tensor a shape without data, so the real FSDP2 code runs, at any size, on the CPU:

- the model is built on meta, wrapped with ``fully_shard`` as torchtitan wraps a
  Llama (the embedding, each decoder layer, the final norm with the lm_head, and the
  root; one ``MixedPrecisionPolicy``), then laid out with ``to_empty`` as fake
  tensors: each rank's parameter shards are the only parameter storage;
- forward and backward run FSDP2's own all-gathers (a flat all-gather buffer, copied
  out into the unit's unsharded parameters, freed after the unit when resharding),
  its prefetch, and its reduce-scatters (a flat input of the unit's gradients, the
  output that becomes the sharded gradients);
- the optimizer steps the sharded parameters, so its state is sharded too.

memprobe's tracker sees each DTensor's local shard (``measure.tracker.physical``) and
FSDP2's in-place storage resizes (an unsharded parameter is freed and re-allocated by
``UntypedStorage.resize_``, not by a new tensor), so the per-rank allocation pattern is
the one FSDP2 makes. FSDP2's collectives are bracketed while they run: what they
allocate (all-gather buffers, reduce-scatter input) is its own category, except the
reduce-scatter output that becomes the sharded gradients.

Context parallel (``cp``, :mod:`memprobe.profile.context_parallel`): each rank holds
``tokens`` of a sequence ``cp`` times as long (memprobe's CP kernels assume the same:
the logits are ``[B, tokens, V]`` per rank), K and V all-gathered for attention. FSDP
shards over all ``fsdp x cp`` ranks (torchtitan's ``dp_shard_cp`` mesh).

Tensor parallel (``tp``, :mod:`memprobe.profile.tensor_parallel`): DTensor's colwise
and rowwise projections and a vocabulary-parallel lm_head on the innermost dimension
of a ``(fsdp x cp, tp)`` mesh, applied before ``fully_shard`` (FSDP2 then shards each
tp shard over the other dimension); the log-prob kernel gets this rank's vocabulary
shard of the logits and the tp group. Without FSDP (``--tp`` alone) the parameters are
laid out as they are, no ``fully_shard``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from memprobe.errors import UserError
from memprobe.measure.tracker import physical, resizes_recorded_by_caller
from memprobe.profile.context_parallel import cp_attention
from memprobe.profile.hf import HFStep, _torch_dtype
from memprobe.profile.phases import events_so_far
from memprobe.profile.step import COMMUNICATION, CP_KV, UNSHARDED
from memprobe.profile.tensor_parallel import (
    check_tp_sizes,
    even_split_bytes,
    parallelize,
    split_sizes,
)
from memprobe.records import Event

# The op name of an unsharded parameter re-allocated by FSDP2's storage resize.
RESIZE_OP = "fsdp.alloc_storage (unshard)"
MP_OUTPUTS = ("fp32", "none")
BOOLEANS = {"true": True, "false": False}
# torch's FSDP2 builds every rank's share of each all-gather, so a simulation's time grows
# with the ranks sharded over (a 2-layer toy: ~17 s at 1,024 ranks, ~70 s at 8,192 on a
# loaded 2-core machine; --fsdp 2^20 ran for hours). Shard groups in use are thousands of
# ranks at most (larger jobs shard within a group: HSDP), so larger ones are refused.
MAX_SHARD_RANKS = 16_384


def sharding_from_flags(
    *,
    fsdp: int = 1,
    cp: int = 1,
    tp: int = 1,
    reshard_after_forward: str = "true",
    mp_reduce: str | None = None,
    mp_output: str | None = None,
) -> Sharding:
    """The :class:`Sharding` the command-line flags describe, checked."""
    if reshard_after_forward.lower() not in BOOLEANS:
        raise UserError(
            f"--reshard-after-forward {reshard_after_forward!r} is not true or false",
            "e.g. --reshard-after-forward false",
        )
    sharding = Sharding(
        fsdp=fsdp,
        cp=cp,
        tp=tp,
        reshard_after_forward=BOOLEANS[reshard_after_forward.lower()],
        mp_reduce=mp_reduce,
        mp_output=None if mp_output == "none" else mp_output,
    )
    if sharding.shard_ranks == 1 and (mp_reduce or mp_output or reshard_after_forward != "true"):
        raise UserError(
            "--mp-reduce, --mp-output and --reshard-after-forward are FSDP2's",
            "add --fsdp N (or --cp N)",
        )
    return sharding


def sharded_dtypes(dtype: str, param_dtype: str | None, mp_param: str | None) -> tuple[str, str]:
    """(compute, stored) dtypes of a sharded step: ``--mp-param`` computes (default
    ``--dtype``); the sharded parameters are ``--param-dtype``, else float32 when
    ``--mp-param`` is given (FSDP2's mixed precision keeps float32 shards), else
    ``--dtype``."""
    if mp_param is not None:  # checked here, so the line names the flag given
        _torch_dtype(mp_param, "--mp-param")
    compute = mp_param or dtype
    stored = param_dtype or ("fp32" if mp_param else dtype)
    return compute, stored


@dataclass(frozen=True)
class Sharding:
    """How the step is spread over ranks. ``fsdp``: ranks the parameters are sharded
    over, besides ``cp``; ``cp``: ranks a sequence is split over (FSDP shards over
    these too); ``reshard_after_forward``: FSDP2 frees a unit's unsharded parameters
    after its forward (all-gathers them again in backward); ``mp_reduce``: the
    reduce-scatter's dtype (None: the gradients'); ``mp_output``: ``fp32`` casts every
    FSDP unit's floating outputs to float32 (``MixedPrecisionPolicy.output_dtype``);
    ``tp``: tensor-parallel ranks, the innermost mesh dimension
    (:mod:`memprobe.profile.tensor_parallel`; FSDP2 then shards each tp shard)."""

    fsdp: int = 1
    cp: int = 1
    tp: int = 1
    reshard_after_forward: bool = True
    mp_reduce: str | None = None
    mp_output: str | None = None

    def __post_init__(self) -> None:
        for name in ("fsdp", "cp", "tp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UserError(f"--{name} must be a positive integer, got {value!r}", "e.g. 8")
        if self.shard_ranks > MAX_SHARD_RANKS:
            raise UserError(
                f"--fsdp {self.fsdp:,} x --cp {self.cp:,} shards over {self.shard_ranks:,} ranks; "
                f"at most {MAX_SHARD_RANKS:,} are simulated (the simulation's time grows with "
                "the ranks)",
                "use the size of one FSDP shard group (with HSDP, its shard dimension)",
            )
        if self.mp_reduce is not None:
            _torch_dtype(self.mp_reduce, "--mp-reduce")
        if self.mp_output is not None and self.mp_output not in MP_OUTPUTS:
            raise UserError(
                f"--mp-output {self.mp_output!r} is not one of {', '.join(MP_OUTPUTS)}",
                "e.g. --mp-output fp32",
            )

    @property
    def world(self) -> int:
        return self.fsdp * self.cp * self.tp

    @property
    def shard_ranks(self) -> int:
        """The ranks FSDP2 shards over (1: no FSDP, tensor parallel alone)."""
        return self.fsdp * self.cp

    @property
    def active(self) -> bool:
        return self.world > 1

    def words(self) -> str:
        parts = [f"FSDP2 over {self.shard_ranks} ranks"] if self.shard_ranks > 1 else []
        if self.tp > 1:
            parts.append(f"tensor parallel {self.tp}")
        if self.cp > 1:
            parts.append(f"context parallel {self.cp} (K/V all-gathered)")
        parts.append(f"reshard after forward {'on' if self.reshard_after_forward else 'off'}")
        return ", ".join(parts)


@dataclass
class _Notes:
    """What FSDP2 and the CP attention allocated, noted while the step runs: event
    index windows of their collectives, and the storages of the unsharded parameters."""

    comm: list[tuple[int, int]] = field(default_factory=list)
    cp: list[tuple[int, int]] = field(default_factory=list)
    unsharded: dict[int, list[int]] = field(default_factory=dict)
    # The fake world's FSDP and tp meshes (made before fake tensors: they read real
    # ones); None where that dimension has one rank.
    mesh: Any = None
    tp_mesh: Any = None
    # Parameter bytes: unsharded (every element once), this rank's shards (padded), and
    # an even split over the ranks each parameter is sharded over (no padding).
    unsharded_bytes: int = 0
    rank_bytes: int = 0
    even_bytes: int = 0


@dataclass(frozen=True, eq=False)
class ShardedHFStep(HFStep):
    """:class:`HFStep` under FSDP2 (and CP) as rank 0 of a fake world of
    ``sharding.world`` ranks. ``dtype``: what the model computes in (FSDP2's
    ``param_dtype``); ``param_dtype``: what the sharded parameters, their gradients
    and the optimizer are in (float32 with ``--mp-param``). Traced on meta only."""

    sharding: Sharding = Sharding()
    notes: _Notes = field(default_factory=_Notes, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_tp_sizes(self.config, self.sharding.tp)

    @property
    def hidden_route_simulated(self) -> bool:
        return self.sharding.shard_ranks == 1  # not under FSDP2

    @property
    def vocab_shards(self) -> int:
        return self.sharding.tp

    @property
    def master_weights(self) -> bool:
        if self.sharding.shard_ranks == 1:  # tensor parallel alone: as one GPU does
            return super().master_weights
        return False  # FSDP2 keeps the parameters in param_dtype and casts per unit

    @property
    def build_dtype(self) -> torch.dtype:
        if self.sharding.shard_ranks == 1:
            return super().build_dtype
        return _torch_dtype(self.param_dtype or self.dtype, "--param-dtype")

    def logprob_kwargs(self) -> dict[str, Any]:
        if self.notes.tp_mesh is None:
            return {}
        # This rank's vocabulary ids follow from its rank in the tp group (even split).
        return {"group": self.notes.tp_mesh.get_group()}

    def simulation(self, device: str) -> contextlib.AbstractContextManager[str]:
        if device == "cpu":
            return _real_world(self.sharding, self.notes)
        if device != "meta":
            raise UserError(
                f"the sharded step is simulated on meta, not {device}",
                "drop --device, or drop --fsdp/--cp",
            )
        return _fake_world(self.sharding, self.notes)

    def category_of(self, event: Event) -> str | None:
        if event.op == RESIZE_OP or _noted(event, self.notes.unsharded):
            return UNSHARDED
        if any(start <= event.index < end for start, end in self.notes.comm):
            return COMMUNICATION
        if any(start <= event.index < end for start, end in self.notes.cp):
            return CP_KV
        return None

    def build(self, device: torch.device) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        model = super().build(torch.device("meta"))
        layers = getattr(getattr(model, "base_model", None), "layers", None)
        if not isinstance(layers, torch.nn.ModuleList):
            raise UserError(
                f"{self.config.model_type}: no decoder layers at model.base_model.layers",
                "the sharded step wraps each decoder layer with fully_shard (Llama-like models)",
            )
        # No autograd while the model is laid out (the trace's phase stays "setup"), and
        # on meta, outside the fake world's tensors: with tp, FSDP2 joins the two meshes
        # into one, whose coordinates are read from a real mesh tensor.
        with torch.no_grad(), unset_fake_temporarily():
            if self.notes.tp_mesh is not None:
                # Tensor parallel first, then FSDP2 over the other dimension (2-D).
                parallelize(model, layers, self.notes.tp_mesh)
            if self.notes.mesh is not None:
                options = self._fsdp_options()
                for unit in _units(model, layers):
                    fully_shard(unit, **options)
                fully_shard(model, **options)
        # The shards only, on the (fake) device: what each rank allocates.
        with torch.no_grad():
            if self.notes.mesh is not None:
                model.to_empty(device=device)
            else:  # tensor parallel alone
                _laid_out(model, device)
        return model

    def _fsdp_options(self) -> dict[str, Any]:
        """``fully_shard``'s keyword arguments: the FSDP mesh, one mixed precision policy."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        compute, stored = _torch_dtype(self.dtype, "--dtype"), self.build_dtype
        policy = MixedPrecisionPolicy(
            param_dtype=compute if compute != stored else None,
            reduce_dtype=_torch_dtype(self.sharding.mp_reduce, "--mp-reduce")
            if self.sharding.mp_reduce
            else None,
            output_dtype=torch.float32 if self.sharding.mp_output == "fp32" else None,
        )
        return {
            "mesh": self.notes.mesh,
            "mp_policy": policy,
            "reshard_after_forward": self.sharding.reshard_after_forward,
        }

    def run(
        self, device: torch.device, on_model: Callable[[torch.nn.Module], None] | None = None
    ) -> None:
        def noted(model: torch.nn.Module) -> None:
            params = list(model.parameters())
            self.notes.unsharded_bytes = sum(p.numel() * p.element_size() for p in params)
            self.notes.rank_bytes = sum(physical(p).untyped_storage().nbytes() for p in params)
            self.notes.even_bytes = even_split_bytes(params)
            if on_model is not None:
                on_model(model)

        with _fsdp_noted(self.notes), cp_attention(self.sharding.cp, self.notes.cp):
            super().run(device, noted)

    def sharded_summary(self) -> dict[str, Any] | None:
        """The layout, and the parameter bytes per rank against an even split of each
        parameter over the ranks it is sharded over (the unsharded bytes / the FSDP ranks
        without tp; the difference is FSDP2's padding of dim 0 to a multiple of the
        ranks). Gradients and each AdamW moment are sharded the same way, in the same
        dtype."""
        s, n = self.sharding, self.sharding.shard_ranks
        return {
            "fsdp": s.fsdp,
            "cp": s.cp,
            "tp": s.tp,
            "world": s.world,
            "shard_ranks": n,
            "reshard_after_forward": s.reshard_after_forward,
            "mp_param": self.dtype,
            "mp_reduce": s.mp_reduce,
            "mp_output": s.mp_output,
            "sequence_tokens": self.tokens * s.cp,
            "unsharded_parameter_bytes": self.notes.unsharded_bytes,
            "rank_parameter_bytes": self.notes.rank_bytes,
            "even_split_parameter_bytes": self.notes.even_bytes,
            "padding_bytes": self.notes.rank_bytes - self.notes.even_bytes,
            # What each tp rank computes: heads / tp, ... (the whole sizes at tp 1).
            "tp_per_rank": {k: v // s.tp for k, v in split_sizes(self.config).items()},
        }


def _units(model: Any, layers: torch.nn.ModuleList) -> list[Any]:
    """The FSDP units below the root, as torchtitan wraps a Llama: the token embedding,
    each decoder layer, and the final norm with the lm_head (one unit: its input is
    cast to the compute dtype, and with ``--mp-output fp32`` its logits are float32).
    Tied, their one weight stays in the root's group (a unit of its own failed the step)."""
    tied = _tied(model)
    embed = model.get_input_embeddings()
    units: list[Any] = [embed] if isinstance(embed, torch.nn.Module) and not tied else []
    units.extend(layers)
    head = model.get_output_embeddings()
    norm = getattr(model.base_model, "norm", None)
    tail = [m for m in (norm, head) if isinstance(m, torch.nn.Module)]
    if tail and not tied:
        units.append(tail)
    return units


def _laid_out(model: torch.nn.Module, device: torch.device) -> None:
    """``model.to_empty(device=device)`` without FSDP2: each parameter (a DTensor:
    its local shard) and buffer replaced by an empty one on ``device``, ties kept.
    ``to_empty`` itself would swap a meta parameter for its fake counterpart in place,
    which the fake tensor converter's weak reference to it forbids."""
    params: dict[int, torch.nn.Parameter] = {}
    buffers: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in params:
                    empty = torch.empty_like(p, device=device)
                    params[id(p)] = torch.nn.Parameter(empty, requires_grad=p.requires_grad)
                module._parameters[name] = params[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                if id(b) not in buffers:
                    buffers[id(b)] = torch.empty_like(b, device=device)
                module._buffers[name] = buffers[id(b)]


def _tied(model: Any) -> bool:
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and embed is not None and head.weight is embed.weight


@contextlib.contextmanager
def _fake_world(sharding: Sharding, notes: _Notes) -> Iterator[str]:
    """A fake process group of ``sharding.world`` ranks (this process is rank 0), its
    FSDP mesh in ``notes``, and fake tensors on the CPU for the duration; yields the
    device to trace on."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_available():
        raise UserError("this torch has no torch.distributed", "install a torch with it")
    if dist.is_initialized():
        raise UserError(
            "a process group is already initialized in this process",
            "run the sharded simulation in a process of its own",
        )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=sharding.world)
    try:
        _meshes(sharding, notes)
        with FakeTensorMode(allow_non_fake_inputs=True):
            yield "cpu"
    finally:
        notes.mesh = notes.tp_mesh = None
        dist.destroy_process_group()


@contextlib.contextmanager
def _real_world(sharding: Sharding, notes: _Notes) -> Iterator[str]:
    """The process group this process already belongs to (a real gloo run: the check
    of the fake world), its FSDP mesh in ``notes``; the step runs on the cpu."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() != sharding.world:
        raise UserError(
            f"a real sharded run needs a process group of {sharding.world} ranks",
            "start it with torchrun, or simulate on meta",
        )
    _meshes(sharding, notes)
    try:
        yield "cpu"
    finally:
        notes.mesh = notes.tp_mesh = None


def _meshes(sharding: Sharding, notes: _Notes) -> None:
    """The world's device mesh, ``(fsdp x cp, tp)`` as torchtitan lays it out (tp
    innermost: its ranks are neighbours), its dimensions into ``notes``."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(
        "cpu", (sharding.shard_ranks, sharding.tp), mesh_dim_names=("dp_shard_cp", "tp")
    )
    notes.mesh = mesh["dp_shard_cp"] if sharding.shard_ranks > 1 else None
    notes.tp_mesh = mesh["tp"] if sharding.tp > 1 else None


def _noted(event: Event, notes: dict[int, list[int]]) -> bool:
    return event.action == "alloc" and any(at > event.index for at in notes.get(event.storage, ()))


@contextlib.contextmanager
def _fsdp_noted(notes: _Notes) -> Iterator[None]:
    """While active, FSDP2's collectives are bracketed (event windows in ``notes``), its
    unsharded parameters' storages noted, and its storage resizes reach the tracker."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    from memprobe.profile.phases import _ACTIVE

    def bracketed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = events_so_far() or 0
            try:
                return fn(*args, **kwargs)
            finally:
                notes.comm.append((start, events_so_far() or 0))

        return wrapper

    def resizing(fn: Callable[[torch.Tensor], None]) -> Callable[[torch.Tensor], None]:
        def wrapper(tensor: torch.Tensor) -> None:
            before = tensor.untyped_storage().nbytes()
            with resizes_recorded_by_caller():  # below, with its tensor, as FSDP's
                fn(tensor)
            if _ACTIVE and tensor.untyped_storage().nbytes() != before:
                _ACTIVE[-1].resized(tensor, RESIZE_OP)

        return wrapper

    original_init = _fsdp_param.FSDPParam.init_all_gather_outputs

    def init_all_gather_outputs(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        at = events_so_far() or 0
        for tensor in self.all_gather_outputs:
            key = int(tensor.untyped_storage()._cdata)
            notes.unsharded.setdefault(key, []).append(at)

    patches = [
        (_fsdp_param_group, "foreach_all_gather", bracketed),
        (_fsdp_param_group, "foreach_reduce", bracketed),
        (_fsdp_param, "alloc_storage", resizing),
        (_fsdp_param, "free_storage", resizing),
        (_fsdp_param_group, "alloc_storage", resizing),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    try:
        for module, name, wrap in patches:
            setattr(module, name, wrap(getattr(module, name)))
        _fsdp_param.FSDPParam.init_all_gather_outputs = init_all_gather_outputs  # type: ignore[method-assign]
        yield
    finally:
        _fsdp_param.FSDPParam.init_all_gather_outputs = original_init  # type: ignore[method-assign]
        for module, name, value in saved:
            setattr(module, name, value)
