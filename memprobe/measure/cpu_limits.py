"""How far a real CPU run may go: the share of available RAM a case may take, and how
many timed repeats it gets. Shared by the logits and hidden-family cpu backends."""

from __future__ import annotations

import os

SAFE_RAM_SHARE = 0.5
REPEATS = 3


def available_ram_bytes() -> int:
    """MemAvailable from /proc/meminfo, else physical RAM."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
