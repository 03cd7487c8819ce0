"""Snapshot → Findings: what the peak is made of, the step's shapes, the logits family.

Reads torch-format allocator snapshots (real ones, or memprobe's synthesized
ones) and never imports torch, so attributing a file costs no torch start-up.
"""

from memprobe.attribute.findings import (
    DEFAULT_TOP,
    BlockFinding,
    Findings,
    OomFinding,
    attribute,
    attribute_devices,
    attribute_file,
    attribute_file_devices,
)

__all__ = [
    "DEFAULT_TOP",
    "BlockFinding",
    "Findings",
    "OomFinding",
    "attribute",
    "attribute_devices",
    "attribute_file",
    "attribute_file_devices",
]
