"""A model of PyTorch's native CUDA caching allocator: reserved memory on any machine.

Pure Python (no torch import). The pieces:

- :mod:`~memprobe.allocator.config`: ``PYTORCH_ALLOC_CONF`` text -> :class:`AllocConf`.
- :mod:`~memprobe.allocator.model`: :class:`CachingAllocatorModel`, one device's allocator
  (``malloc``/``free``/``empty_cache``, stats, torch-format ``segments`` and segment events).
- :mod:`~memprobe.allocator.simulate`: :func:`simulate` a sequence of (alloc|free, key, bytes).
- :mod:`~memprobe.allocator.snapshot_replay`: :func:`replay_snapshot` a real snapshot's trace and
  compare with what the real allocator did.
"""

from memprobe.allocator.config import (
    AllocConf,
    alloc_conf_from_env,
    alloc_conf_setting,
    alloc_conf_to_model,
    modelled_alloc_conf,
    parse_alloc_conf,
    set_process_alloc_conf,
    settings_words,
)
from memprobe.allocator.model import (
    AllocatorStats,
    CachingAllocatorModel,
    OutOfMemory,
    allocation_size,
    round_size,
)
from memprobe.allocator.simulate import Simulation, simulate
from memprobe.allocator.snapshot_replay import (
    DeviceReplay,
    conf_from_snapshot,
    replay_snapshot,
)

__all__ = [
    "AllocConf",
    "AllocatorStats",
    "CachingAllocatorModel",
    "DeviceReplay",
    "OutOfMemory",
    "Simulation",
    "alloc_conf_from_env",
    "alloc_conf_setting",
    "alloc_conf_to_model",
    "modelled_alloc_conf",
    "allocation_size",
    "conf_from_snapshot",
    "parse_alloc_conf",
    "set_process_alloc_conf",
    "settings_words",
    "replay_snapshot",
    "round_size",
    "simulate",
]
