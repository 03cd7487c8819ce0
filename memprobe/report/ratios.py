"""The two ratios every view of a sweep quotes: peak over floor, and the saving against
``unchunked`` at the same shape. Computed here once, for the terminal table, the JSON
summary and the report page alike."""

from __future__ import annotations

import pandas as pd

REFERENCE = "unchunked"
# The hidden family's reference: the lm_head matmul, then unchunked.
HIDDEN_REFERENCE = "linear_unchunked"
# What makes two rows "the same shape" for the saving against the reference; and the
# hidden size where the run has one (a sweep of --hidden 32,64 quoted each h64 row against
# linear_unchunked's h32 peak: linear_unchunked itself read 1.08x).
SHAPE_KEYS = ["batch", "tokens", "vocab", "dtype", "tp", "cp", "device"]


def with_ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """Add ``peak_over_floor`` and ``saving_vs_unchunked`` (unchunked peak / this peak)."""
    out = frame.copy()
    peak = pd.to_numeric(out["peak_bytes"], errors="coerce")
    floor = pd.to_numeric(out["floor_bytes"], errors="coerce")
    out["peak_over_floor"] = peak / floor
    # Each family against its own reference: logits rows against unchunked, hidden
    # rows (the lm_head fused in or not) against linear_unchunked.
    hidden = out["hidden"].notna() if "hidden" in out else pd.Series(False, index=out.index)
    reference = hidden.map({True: HIDDEN_REFERENCE, False: REFERENCE})
    keys = [*SHAPE_KEYS, *(["hidden"] if "hidden" in out else [])]
    base = out[(out["kernel"] == reference) & (out["status"] == "ok")]
    base = base.drop_duplicates(keys)[[*keys, "peak_bytes"]]
    base = base.rename(columns={"peak_bytes": "_unchunked_peak"})
    out = out.merge(base, on=keys, how="left")
    out["saving_vs_unchunked"] = pd.to_numeric(out["_unchunked_peak"], errors="coerce") / peak
    return out.drop(columns="_unchunked_peak")


def has_ratios(frame: pd.DataFrame) -> bool:
    return {"peak_over_floor", "saving_vs_unchunked"} <= set(frame.columns)
