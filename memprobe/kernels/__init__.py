"""Kernels that turn logits ``[B, S, V]`` into per-token target log-probabilities.

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
from memprobe.kernels.local_chunked import (
    DEFAULT_LOCAL_LOGPROB_CHUNK_SIZE,
    LocalChunkedInplaceLogprob,
    LocalChunkedLogprob,
    local_chunked_inplace_logprobs,
    local_chunked_logprobs,
)
from memprobe.kernels.registry import KERNELS, KernelSpec, get_kernel, get_spec, kernel_names

__all__ = [
    "DEFAULT_LOCAL_LOGPROB_CHUNK_SIZE",
    "KERNELS",
    "ChunkedDistributedLogprob",
    "DistributedLogprob",
    "KernelSpec",
    "LocalChunkedInplaceLogprob",
    "LocalChunkedLogprob",
    "chunked_distributed_collectives",
    "chunked_distributed_logprobs",
    "distributed_collectives",
    "distributed_logprobs",
    "filter_logits",
    "filtered_logprobs",
    "get_kernel",
    "get_spec",
    "kernel_names",
    "local_chunked_inplace_logprobs",
    "local_chunked_logprobs",
    "naive_chunked_logprobs",
    "next_token_logprobs",
    "precast_chunked_logprobs",
    "select_kernel",
    "unchunked_logprobs",
]
