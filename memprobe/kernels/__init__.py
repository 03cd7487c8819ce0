"""Kernels that turn logits ``[B, S, V]`` (or hidden states ``[B, S, H]`` and an
lm_head weight ``[V, H]``) into per-token target log-probabilities.

Pure torch autograd code: nothing here imports the rest of memprobe.
"""

from memprobe.kernels.autograd_reference import (
    naive_chunked_logprobs,
    precast_chunked_logprobs,
    unchunked_logprobs,
)
from memprobe.kernels.dispatch import next_token_logprobs, select_kernel
from memprobe.kernels.distributed import (
    ChunkedDistributedLogprob,
    DistributedLogprob,
    chunked_distributed_collectives,
    chunked_distributed_logprobs,
    distributed_collectives,
    distributed_logprobs,
)
from memprobe.kernels.filtered import filter_logits, filtered_logprobs
from memprobe.kernels.filtered_chunked import FilteredChunkedLogprob, filtered_chunked_logprobs
from memprobe.kernels.fused_linear import (
    FusedLinearChunkedLogprob,
    fused_linear_chunked_logprobs,
)
from memprobe.kernels.linear_unfused import (
    linear_local_chunked_logprobs,
    linear_unchunked_logprobs,
)
from memprobe.kernels.local_chunked import (
    DEFAULT_LOCAL_LOGPROB_CHUNK_SIZE,
    LocalChunkedInplaceLogprob,
    LocalChunkedLogprob,
    local_chunked_inplace_logprobs,
    local_chunked_logprobs,
)
from memprobe.kernels.local_tiled import (
    DEFAULT_TILE_SIZE,
    DEFAULT_TILED_CHUNK_SIZE,
    LocalTiledInplaceLogprob,
    LocalTiledLogprob,
    local_tiled_inplace_logprobs,
    local_tiled_logprobs,
)
from memprobe.kernels.registry import KERNELS, get_kernel, get_spec, kernel_names
from memprobe.kernels.spec import INPUT_PROTOCOLS, KernelSpec
from memprobe.kernels.torch_linear_ce import (
    torch_linear_ce_accurate_logprobs,
    torch_linear_ce_logprobs,
)
from memprobe.kernels.unavailable import KernelUnavailable

__all__ = [
    "DEFAULT_LOCAL_LOGPROB_CHUNK_SIZE",
    "DEFAULT_TILED_CHUNK_SIZE",
    "DEFAULT_TILE_SIZE",
    "INPUT_PROTOCOLS",
    "KERNELS",
    "ChunkedDistributedLogprob",
    "DistributedLogprob",
    "FusedLinearChunkedLogprob",
    "KernelSpec",
    "KernelUnavailable",
    "LocalChunkedInplaceLogprob",
    "LocalChunkedLogprob",
    "LocalTiledInplaceLogprob",
    "LocalTiledLogprob",
    "chunked_distributed_collectives",
    "chunked_distributed_logprobs",
    "distributed_collectives",
    "distributed_logprobs",
    "filter_logits",
    "filtered_logprobs",
    "FilteredChunkedLogprob",
    "filtered_chunked_logprobs",
    "fused_linear_chunked_logprobs",
    "get_kernel",
    "get_spec",
    "kernel_names",
    "linear_local_chunked_logprobs",
    "linear_unchunked_logprobs",
    "local_chunked_inplace_logprobs",
    "local_chunked_logprobs",
    "local_tiled_inplace_logprobs",
    "local_tiled_logprobs",
    "naive_chunked_logprobs",
    "next_token_logprobs",
    "precast_chunked_logprobs",
    "select_kernel",
    "torch_linear_ce_accurate_logprobs",
    "torch_linear_ce_logprobs",
    "unchunked_logprobs",
]
