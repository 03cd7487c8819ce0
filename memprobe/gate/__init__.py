"""The guard that fails CI on a memory regression: the rules and the verdict
(:mod:`~memprobe.gate.rules`), and the stage ``memprobe gate`` runs (:mod:`~memprobe.gate.job`)."""

from __future__ import annotations

from memprobe.gate.job import GateOutcome, GateRequest, run_gate
from memprobe.gate.rules import (
    LIMIT_UNITS,
    Check,
    Row,
    Verdict,
    case_label,
    check_baseline,
    check_rule,
    check_rules,
    evaluate,
    rule_matches,
)

__all__ = [
    "LIMIT_UNITS",
    "Check",
    "GateOutcome",
    "GateRequest",
    "Row",
    "Verdict",
    "case_label",
    "check_baseline",
    "check_rule",
    "check_rules",
    "evaluate",
    "rule_matches",
    "run_gate",
]
