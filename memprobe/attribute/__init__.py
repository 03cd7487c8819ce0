"""Snapshot → Findings: which blocks make a peak or an OOM, what they are, who made them.

Reads torch-format allocator snapshots (real ones, or memprobe's synthesized
ones) and never imports torch, so attributing a file costs no torch start-up.
"""

from memprobe.attribute.findings import (
    DEFAULT_TOP,
    BlockFinding,
    Findings,
    OomFinding,
    attribute,
    attribute_file,
)

__all__ = ["DEFAULT_TOP", "BlockFinding", "Findings", "OomFinding", "attribute", "attribute_file"]
