"""Reports: a self-contained HTML page and PNG plots for a sweep run or one snapshot.

``write_report(run_dir)`` renders ``report.html`` and its plots from a run's files;
``write_findings_page(findings, path, title=...)`` renders one snapshot's attribution.
"""

from __future__ import annotations

from memprobe.render.html import REPORT_NAME, write_report
from memprobe.render.findings_html import write_findings_page

__all__ = ["REPORT_NAME", "write_findings_page", "write_report"]
