"""What is wrong with a file or row given as results, said in one line: a link that
leads nowhere, a file that is no results.json, a row whose values contradict each other.
Kept apart from :mod:`memprobe.results`, which reads and writes run directories."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeAlias, TypeGuard

from memprobe import __version__
from memprobe.errors import UserError
from memprobe.io.sizes import MAX_SIZE
from memprobe.io.text import DuplicateKey, binary_kind, json_error, quoted

Row = Mapping[str, Any]


# Parts of a row's peak: the peak is the most held at any moment of the step, so neither
# phase's peak nor the floor (the inputs and their gradients, held through backward) can
# exceed it in any row a sweep writes.
_PARTS_OF_PEAK = ("forward_peak_bytes", "backward_peak_bytes", "floor_bytes")


def contradiction(row: Row) -> str | None:
    """What in a row, each value valid alone, contradicts the rest, or None. A peak below
    its own floor passed ``max_peak_over_floor`` at a ratio under 1; a meta row with times
    (meta runs nothing, so a sweep there writes none) made ``plan --from-run`` pick a
    chunk as "measured fastest ... on meta"."""
    peak = row["peak_bytes"]
    if row["status"] == "ok" and peak is None:
        # Both backends write an ok case's peak (a case without one is oom, skipped or an
        # error). A baseline of such rows (a column renamed by another tool or version)
        # failed every regression check "no peak_bytes to compare", blaming the run.
        return "is ok but has no peak_bytes (every finished case has its peak)"
    for key in _PARTS_OF_PEAK if peak is not None else ():
        if row[key] is not None and row[key] > peak:
            return f"{key} {row[key]:,} is above its peak_bytes {peak:,} (a peak holds it)"
    reserved = row.get("reserved_peak_bytes")
    if row.get("reserved_source") == "modelled" and reserved is not None and peak is not None:
        # The model holds every block it hands out inside a segment, so what it reserves
        # at most is never below the most allocated: a row saying so was edited, and the
        # report showed "reserved peak 1 B" beside a 224 KiB peak. (A measured figure is
        # a difference from the reserve before the step, which can reuse cached memory.)
        if reserved < peak:
            return (
                f"reserved_peak_bytes {reserved:,} is below its peak_bytes {peak:,} "
                "(modelled reserved memory holds the peak)"
            )
    if row["device"] == "meta":
        timed = [k for k in ("fwd_time_s", "bwd_time_s") if row[k] is not None]
        if timed:
            return f"is on meta but has {' and '.join(timed)} (a meta run simulates: no times)"
    return None


def link_to_nothing(file: Path) -> UserError | None:
    """The error for a results file that is a link leading nowhere (dangling, or a loop),
    else None. exists() follows the link: such a file was "no results at RUN", and a
    baseline "does not exist yet", where the link is there to see."""
    if not file.is_symlink() or file.exists():
        return None
    return UserError(
        f"{file} is a link to {os.readlink(file)}, which leads to no file "
        "(it is missing, or a loop of links)",
        "point the link at a results.json, or remove it",
    )


def not_results(file: Path, raw: bytes, exc: Exception, *, in_a_run: bool) -> UserError:
    """What is wrong with a file that is no results.json, said: "point at a run directory"
    alone was the hint to a user who had (its results.json damaged), and named neither
    the byte that is not UTF-8 nor the place the JSON stops."""
    kind = binary_kind(raw)
    if kind:
        why = f"is {kind}, not JSON"
    elif isinstance(exc, UnicodeDecodeError):
        # Counted in the file: a decoder past a byte order mark counts from after it.
        offset = exc.start + len(raw) - len(exc.object)
        why = f"is not UTF-8 text (byte {raw[offset]:#04x} at offset {offset:,})"
    elif isinstance(exc, json.JSONDecodeError):
        why = f"is not JSON ({json_error(exc)})"
    elif isinstance(exc, RecursionError):
        why = "nests too deep to read"
    elif isinstance(exc, DuplicateKey):
        why = str(exc)
    else:
        why = "holds no list of 'rows'"
    hint = (
        "the file is damaged or not memprobe's; re-run the sweep"
        if in_a_run
        else "give a run directory or its results.json"
    )
    return UserError(f"{file} is not a memprobe results.json: it {why}", hint)


def twice_in(file: Path, exc: Exception) -> UserError | None:
    """A run.json that gives one key twice (json keeps the last): said so, where "no
    readable run.json" was the line; None for any other failure to read it."""
    if not isinstance(exc, DuplicateKey):
        return None
    return UserError(f"{file} {exc}", "the file is damaged or edited; re-run the sweep")


def not_a_run_record(meta: Any) -> str | None:
    """What a run.json that parsed holds, when it is not memprobe's run record (an object
    listing its planned cases); None when it is one."""
    if not isinstance(meta, dict):
        return f"holds a JSON {_kind(meta)}, not memprobe's run record (an object)"
    if not isinstance(meta.get("cases"), list):
        cases = meta.get("cases")
        said = "no 'cases'" if "cases" not in meta else f"'cases' that is {_article(_kind(cases))}"
        return f"has {said}, where memprobe's run.json lists the cases it planned"
    return None


def unreadable_case(raw: Any, keys: tuple[str, ...]) -> str | None:
    """What is wrong with one of run.json's planned cases (``keys``: a case's fields), or
    None. "A case memprobe cannot read" of an unknown key left the user to guess which,
    and a case without its device (which memprobe always writes) was refused as "a case
    its run.json did not plan"."""
    if not isinstance(raw, dict):
        return f"is {_article(_kind(raw))}, not an object"
    if not set(raw) <= set(keys):
        return f"has keys memprobe does not write: {_names(set(raw) - set(keys))}"
    # hidden is absent from runs made before the hidden family: a logits case.
    missing = set(keys) - {"hidden"} - set(raw)
    return f"has no {_names(missing)}" if missing else None


def mixed_versions(run_dir: Path, meta: Row, torch_version: str) -> UserError | None:
    """A resume that would add this memprobe's and this torch's rows to a run another
    version started, or None. A simulated peak is what torch's meta kernels allocate, so
    the page showed rows of two versions under the first one's name. A build tag (2.13.0
    and 2.13.0+cpu) is the same torch; a run that records no version is not refused."""
    now = {"memprobe": __version__, "torch": torch_version}
    for name, current in now.items():
        then = meta.get(f"{name}_version")
        if isinstance(then, str) and then.split("+")[0] != current.split("+")[0]:
            return UserError(
                f"cannot resume {run_dir}: {name} {quoted(then)} started it, this is "
                f"{name} {current}, and the run would mix the two versions' measurements",
                "start a new run, or resume it with the version that started it",
            )
    return None


def changed_kernel(run_dir: Path, meta: Row, kernels: Iterable[str]) -> UserError | None:
    """A resume that would add rows of a user kernel whose source changed since the run
    began to its rows measured before, or None. A kernel edited between an interrupted
    run and its resume (unchunked's code, then local_chunked's) had both under one name:
    3.51x its floor at 64 tokens, 2.02x at 128, one kernel's ladder to the page and gate."""
    from memprobe.kernels.user_sources import kernel_source_digests, kernel_source_files

    recorded = meta.get("kernel_sources")
    if not isinstance(recorded, dict):
        return None  # a run made before sources were recorded
    for kernel, now in kernel_source_digests(kernels).items():
        then = recorded.get(kernel)
        if isinstance(then, str) and then != now:
            files = ", ".join(map(str, kernel_source_files(kernel)))
            return UserError(
                f"cannot resume {run_dir}: kernel {quoted(kernel)} changed since the run "
                f"began ({files} is not the code its finished rows measured), and the run "
                "would mix the two versions' measurements",
                "start a new run, or resume it with the code that started it",
            )
    return None


def _kind(value: Any) -> str:
    """What a JSON value is, in JSON's words."""
    kinds = {list: "array", dict: "object", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def _article(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


# Keys named in one line: a tampered run.json may hold thousands, each a megabyte long.
MAX_NAMED = 3


def _names(keys: set[str]) -> str:
    shown = sorted(keys)[:MAX_NAMED]
    more = f" and {len(keys) - len(shown):,} more" if len(keys) > len(shown) else ""
    return ", ".join(quoted(k) for k in shown) + more


# A sweep's --budget and --other, in bytes (other 0 when not given), as run.json records
# them (null without --budget): `memprobe report` and a --resume's page mark the budget the
# sweep's own page did ("No memory budget given" was what a re-render said).
BUDGET_KEYS = ("budget_bytes", "other_bytes")
RunBudget: TypeAlias = "tuple[int, int] | None"


def budget_record(budget: RunBudget) -> dict[str, int | None]:
    return dict(zip(BUDGET_KEYS, budget or (None, None), strict=True))


def recorded_budget(meta: Row) -> RunBudget:
    """(budget, other) bytes as run.json records them; None for a run without a budget
    (and for run.json files older than the keys). A value no sweep writes is refused in
    one line, as the other run.json fields are, never read as no budget."""
    budget, other = (meta.get(key) for key in BUDGET_KEYS)
    if budget is None and other is None:
        return None
    if _size(budget) and _size(other) and other < budget:
        return budget, other
    shown = ", ".join(
        f"{k} {str(v)[:40]!r}" for k, v in zip(BUDGET_KEYS, (budget, other), strict=True)
    )
    raise UserError(
        f"run.json records a budget no sweep writes ({shown})",
        "give the budget again (--budget, --other), or re-run the sweep",
    )


def _size(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SIZE
