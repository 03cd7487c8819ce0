"""Results + rules (+ a baseline) → Verdict: the guard that fails CI on a memory regression.

Decisions that keep a broken setup from passing:

* A rule that matches no case is a usage error (exit 2): a misspelt kernel
  name or filter must never turn into a green check.
* A case a rule covers whose status is not ``ok`` (``oom``, ``error`` or
  ``skipped``) fails that rule: its limits were not verified. Narrow the
  rule's filters to leave such a case out on purpose.
* A limit whose measurement is missing (e.g. ``big_fp32_blocks`` from the
  cuda backend, which has no tracker) fails as "not measured".
* Against a baseline, a case fails when its peak grows by more than
  ``max_regression`` percent, when it is gone, or when it no longer finishes.
  Cases new since the baseline are listed but not compared.

"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypedDict

from memprobe.config import Rule
from memprobe.errors import UserError
from memprobe.io.text import shortened
from memprobe.results import (
    KEY_COLUMNS,
    CaseKey,
    case_key,
    check_unique_cases,
    unfinished,
)

if TYPE_CHECKING:
    pass

# Each limit: the rule attribute, how to read the measured value off a row, its unit.
LIMIT_UNITS = {"max_peak": "bytes", "max_peak_over_floor": "ratio", "max_big_fp32_blocks": "count"}

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Check:
    """One rule limit (or the baseline) applied to one case."""

    source: str  # "rules[0]" or "baseline"
    # a LIMIT_UNITS key; "status" (oom, error, skipped); baseline: "regression", "disappeared"
    kind: str
    case: str  # human label of the case
    case_id: str
    passed: bool
    measured: float | None = None
    limit: float | None = None
    unit: str = "bytes"  # "bytes" | "ratio" | "count"
    reference: float | None = None  # baseline peak for a baseline check
    reason: str = ""  # why, when the numbers alone do not say (status, missing, gone)
    rule: str = ""  # what the rule selects: "local_chunked* tokens=20000"

    @property
    def excess(self) -> float | None:
        """How far over the limit (positive on a violation), None without numbers."""
        if self.measured is None or self.limit is None:
            return None
        return self.measured - self.limit

    @property
    def excess_pct(self) -> float | None:
        excess = self.excess
        if excess is None or not self.limit:
            return None
        return 100.0 * excess / self.limit


@dataclass(frozen=True)
class Verdict:
    """The gate's answer: every check, plus where the inputs came from."""

    checks: tuple[Check, ...]
    results: str  # where the results came from
    cases: int
    config: str | None = None
    baseline: str | None = None
    max_regression: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


# -- rows ---------------------------------------------------------------------


def case_label(row: Row) -> str:
    """``local_chunked b1 s20000 v131072 bf16 c1024 meta``: the case id without its hash
    (``h4096`` after the kernel for the hidden family, as in the id: two cases of a sweep
    over --hidden 32,64 were two lines alike)."""
    chunk = "none" if row.get("chunk_size") is None else row.get("chunk_size")
    hidden = "" if row.get("hidden") is None else f" h{row.get('hidden')}"
    label = (
        f"{row.get('kernel')}{hidden} b{row.get('batch')} s{row.get('tokens')} "
        f"v{row.get('vocab')} {row.get('dtype')} c{chunk}"
    )
    for key in ("tp", "cp"):
        if row.get(key) not in (None, 1):
            label += f" {key}{row.get(key)}"
    return f"{label} {row.get('device')}"


def _case_id(row: Row) -> str:
    return str(row.get("case_id") or case_label(row).replace(" ", "-"))


# -- rules --------------------------------------------------------------------


def rule_matches(rule: Rule, row: Row) -> bool:
    if not fnmatch.fnmatchcase(str(row.get("kernel")), rule.kernel):
        return False
    return all(row.get(key) in allowed for key, allowed in rule.filters().items())


def _measured(kind: str, row: Row) -> float | None:
    if kind == "max_peak":
        return row.get("peak_bytes")
    if kind == "max_big_fp32_blocks":
        return row.get("big_fp32_blocks")
    peak, floor = row.get("peak_bytes"), row.get("floor_bytes")
    if peak is None or not floor:
        return None
    return peak / floor


class _CaseFields(TypedDict):
    """The fields every check of one case (and one rule, or the baseline) shares."""

    source: str
    case: str
    case_id: str
    rule: str


_MEASURED_FROM = {
    "max_peak": "peak_bytes",
    "max_peak_over_floor": "peak_bytes / floor_bytes",
    "max_big_fp32_blocks": "big_fp32_blocks",
}


def check_rule(rule: Rule, row: Row) -> list[Check]:
    """The checks of one rule on one case it matches."""
    common: _CaseFields = {
        "source": rule.name,
        "case": case_label(row),
        "case_id": _case_id(row),
        "rule": rule.describe(),
    }
    status = row.get("status")
    if status != "ok":
        reason = f"{_what_happened(row)}; its limits are unverified"
        return [Check(kind="status", passed=False, reason=reason, **common)]
    checks = []
    for kind, limit in rule.limits().items():
        measured = _measured(kind, row)
        unit = LIMIT_UNITS[kind]
        if measured is None:
            reason = f"not measured ({_MEASURED_FROM[kind]} is empty for this case)"
            checks.append(
                Check(kind=kind, passed=False, limit=limit, unit=unit, reason=reason, **common)
            )
        else:
            passed = measured <= limit
            checks.append(
                Check(kind=kind, passed=passed, measured=measured, limit=limit, unit=unit, **common)
            )
    return checks


# What a row's status says happened to its case. Only a case a --shard rank went silent
# on never finished: an error ran and failed, an oom ran out of memory.
_HAPPENED = {
    "oom": "case ran out of memory",
    "error": "case failed with an error",
    "skipped": "case was skipped",
}


def _what_happened(row: Row) -> str:
    status = row.get("status")
    note = f": {row['note']}" if row.get("note") else ""
    what = "case did not finish" if unfinished(row) else _HAPPENED.get(str(status))
    return f"{what or 'case did not run'} (status {status}{note})"


def check_rules(rows: Sequence[Row], rules: Iterable[Rule], *, source: str) -> list[Check]:
    """Every rule on every case it matches; a rule matching nothing is a UserError."""
    checks: list[Check] = []
    for rule in rules:
        matched = [row for row in rows if rule_matches(rule, row)]
        if not matched:
            raise _no_match_error(rule, rows, source)
        for row in matched:
            checks.extend(check_rule(rule, row))
    return checks


def check_each_rule_matches(rows: Sequence[Row], rules: Iterable[Rule], *, source: str) -> None:
    """Refuse the first rule that matches none of ``rows`` (results, or the cases a
    configured sweep plans, asked before it runs)."""
    for rule in rules:
        if not any(rule_matches(rule, row) for row in rows):
            raise _no_match_error(rule, rows, source)


def _no_match_error(rule: Rule, rows: Sequence[Row], source: str) -> UserError:
    def present(key: str) -> str:
        # A row without the value (a device column an older file lacks) is no "None".
        values = sorted({"(none recorded)" if r.get(key) is None else str(r[key]) for r in rows})
        return shortened(f"{key} {','.join(values) or 'none'}", 120)

    # The rule's kernel glob and the rows' names as the config and results hold them:
    # one of a megabyte made the one line a megabyte long.
    message = f"{rule.where} ({shortened(rule.describe())}) matches no case in {source}"
    if rule.device and "cuda" in rule.device and not any(r.get("device") == "cuda" for r in rows):
        import torch

        if not torch.cuda.is_available():
            return UserError(
                f"{message}: it needs cuda results and CUDA is not available here",
                "run the gate on a GPU machine, or give RESULTS measured on one",
            )
    hint = "a rule that matches nothing would pass silently; present: " + "; ".join(
        present(k) for k in ("kernel", "tokens", "vocab", "dtype", "device")
    )
    return UserError(message, hint)


# -- baseline -----------------------------------------------------------------


def check_baseline(
    rows: Sequence[Row], baseline: Sequence[Row], *, max_regression: float
) -> tuple[list[Check], list[str]]:
    """Each baseline case against this run. Returns the checks and notes."""
    current = {case_key(r): r for r in rows}
    base_devices = {r.get("device") for r in baseline}
    devices = {r.get("device") for r in rows}
    if baseline and rows and not base_devices & devices:
        raise UserError(
            f"the baseline was measured on {_devices(base_devices)} and these "
            f"results on {_devices(devices)}: nothing to compare",
            "compare like with like (set device in [tool.memprobe.sweep] or make a new baseline)",
        )
    # The growth allowed, as the decimal the user wrote ("15" is 115/100 exactly). In
    # floats 1 + 15/100 is just under 1.15: a peak of exactly +15% (115 MiB over 100 MiB)
    # FAILed "allowed +15.00% = 115.00 MiB: over by 0 B". Bytes are compared exactly.
    allowed = 1 + Fraction(repr(max_regression)) / 100
    checks: list[Check] = []
    matched = _chunk_free_matches(rows, baseline, current)
    for base in baseline:
        row = current.get(case_key(base)) or matched.get(case_key(base))
        common: _CaseFields = {
            "source": "baseline",
            "case": case_label(base),
            "case_id": _case_id(base),
            "rule": "",
        }
        base_status, base_peak = base.get("status"), base.get("peak_bytes")
        if row is None:
            checks.append(
                Check(
                    kind="disappeared",
                    passed=False,
                    reason="disappeared: in the baseline, not in these results",
                    **common,
                )
            )
            continue
        # This run's id for the case: a baseline's case_id may disagree with its columns,
        # and the failure's evidence is looked up by it in these results.
        common["case_id"] = _case_id(row)
        # ... and its label (a kernel that ignores the chunk size matches across sizes).
        common["case"] = case_label(row)
        status = row.get("status")
        if base_status != "ok":
            # Nothing to regress from; say so rather than drop the case.
            reason = f"baseline status {base_status}, now {status}"
            checks.append(Check(kind="status", passed=True, reason=reason, **common))
        elif status != "ok":
            note = f": {row['note']}" if row.get("note") else ""
            reason = f"turned {status}{note} (was ok)"
            checks.append(Check(kind="status", passed=False, reason=reason, **common))
        elif base_peak is None or row.get("peak_bytes") is None:
            reason = "no peak_bytes to compare"
            checks.append(Check(kind="regression", passed=False, reason=reason, **common))
        else:
            peak = row["peak_bytes"]
            limit = base_peak * allowed
            checks.append(
                Check(
                    kind="regression",
                    passed=peak <= limit,
                    measured=peak,
                    limit=_printable(limit),
                    reference=base_peak,
                    **common,
                )
            )
    base_keys = {case_key(b) for b in baseline} | {case_key(r) for r in matched.values()}
    new = [r for r in rows if case_key(r) not in base_keys]
    notes = [f"{len(new)} case(s) not in the baseline, not compared"] if new else []
    return checks, notes


def _devices(devices: set[Any]) -> str:
    """The devices rows were measured on, in words: a row may record none (a results file
    written without the column), which read "measured on None"."""
    named = sorted(str(d) for d in devices if d is not None)
    unnamed = ["an unrecorded device (rows that name none)"] if None in devices else []
    return ", ".join(named + unnamed)


def _printable(limit: Fraction) -> float:
    """An exact limit as the float a line prints: past a float's range (a baseline peak
    at --max-regression 1e307) it is inf, as the float arithmetic gave before; the check
    itself is made on the exact bytes."""
    try:
        return float(limit)
    except OverflowError:
        return math.inf


def _chunk_free_matches(
    rows: Sequence[Row], baseline: Sequence[Row], current: Mapping[CaseKey, Row]
) -> dict[CaseKey, Row]:
    """This run's row for each baseline case of a kernel that ignores the chunk size
    (unchunked, ...), swept at another ``--chunk-size``: the sweep records the first size
    given on such a kernel's row, so the same case would otherwise have "disappeared"."""
    missing = [b for b in baseline if case_key(b) not in current]
    if not missing:
        return {}
    # The registry imports torch: only a gate that lost a case pays for it.
    from memprobe.kernels.registry import KERNELS, PEERS

    specs = {**KERNELS, **PEERS}
    free = {name for name, spec in specs.items() if not spec.uses_chunk_size}

    def key(row: Row) -> CaseKey:
        return tuple(row.get(k) for k in KEY_COLUMNS if k != "chunk_size")

    by_key: dict[CaseKey, list[Row]] = {}
    for row in rows:
        if row.get("kernel") in free:
            by_key.setdefault(key(row), []).append(row)
    out = {}
    for base in missing:
        found = by_key.get(key(base), [])
        if base.get("kernel") in free and len(found) == 1:
            out[case_key(base)] = found[0]
    return out


# -- the whole gate -----------------------------------------------------------


def evaluate(
    rows: Sequence[Row],
    rules: Sequence[Rule],
    *,
    results: str,
    baseline: Sequence[Row] | None = None,
    baseline_source: str | None = None,
    max_regression: float = 0.0,
    config: str | None = None,
) -> Verdict:
    """Rules and (optionally) a baseline applied to a run's rows. Pure: no I/O."""
    if max_regression < 0 or not math.isfinite(max_regression):
        raise UserError(
            f"--max-regression {max_regression} is not a percentage of zero or more", "e.g. 5"
        )
    max_regression += 0.0  # -0 (as typed, or in the TOML) is 0: the lines said "-0%"
    # With a case twice, which row is checked would depend on the order of the file.
    check_unique_cases(rows, results)
    checks = check_rules(rows, rules, source=results)
    notes: list[str] = []
    if baseline is not None:
        check_unique_cases(baseline, baseline_source or "the baseline")
        base_checks, notes = check_baseline(rows, baseline, max_regression=max_regression)
        checks.extend(base_checks)
    return Verdict(
        checks=tuple(checks),
        results=results,
        cases=len(rows),
        config=config,
        baseline=baseline_source,
        max_regression=max_regression,
        notes=tuple(notes),
    )
