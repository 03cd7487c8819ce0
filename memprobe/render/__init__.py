"""Every output memprobe renders, one module per format, all from typed records.

- :mod:`~memprobe.render.console` — the terminal through rich: tables on stdout (plain
  text off a terminal) and the one ``Progress`` (sweep cases, plans) on stderr
- :mod:`~memprobe.render.terminal`, :mod:`~memprobe.render.plan_text` — the sweep's and
  the plan's tables and answers; the sweep's ``--json`` summary
- :mod:`~memprobe.render.html` — the sweep's ``report.html`` (from :mod:`~memprobe.report.page`)
- :mod:`~memprobe.render.png` — the report's PNG plots (plots, timeline), on one
  :mod:`~memprobe.render.canvas`
- :mod:`~memprobe.render.attribute_page`, :mod:`~memprobe.render.plan_page` — the
  attribute and plan pages; every page is a Jinja2 template (``templates/``) extending
  one base page (:mod:`~memprobe.render.templating`)
- :mod:`~memprobe.render.gate_text`, :mod:`~memprobe.render.junit`,
  :mod:`~memprobe.render.markdown` — the gate's verdict for a terminal, CI, a step summary

``write_report(run_dir)`` renders ``report.html`` and its plots from a run's files.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REPORT_NAME", "write_report"]

# The page's name in a run directory (a sweep that writes no page still checks for one).
REPORT_NAME = "report.html"

_ENTRY_POINTS = {"write_report": "memprobe.render.html"}


def __getattr__(name: str) -> Any:
    # Imported on first use: the terminal table, progress and gate text must not pay
    # for matplotlib (the report's plots) when they are all a command prints.
    if name in _ENTRY_POINTS:
        import importlib

        return getattr(importlib.import_module(_ENTRY_POINTS[name]), name)
    raise AttributeError(f"module 'memprobe.render' has no attribute {name!r}")
