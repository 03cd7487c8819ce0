"""A gate Verdict as JUnit XML: one testcase per check, a <failure> per violation."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from memprobe.gate import Verdict
from memprobe.render.gate_text import describe


def junit_tree(verdict: Verdict) -> ET.Element:
    """The <testsuites> root: one testcase per check (rule limit × case, baseline × case),
    a <failure> per violation."""
    total, failed = str(len(verdict.checks)), str(len(verdict.failures))
    counts = {"tests": total, "failures": failed, "errors": "0", "skipped": "0", "time": "0"}
    root = ET.Element("testsuites", {"name": "memprobe gate", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": "memprobe gate", **counts})
    props = ET.SubElement(suite, "properties")
    for name, value in (
        ("results", verdict.results),
        ("config", verdict.config),
        ("baseline", verdict.baseline),
        ("max_regression_pct", f"{verdict.max_regression:g}" if verdict.baseline else None),
    ):
        if value is not None:
            ET.SubElement(props, "property", {"name": name, "value": value})
    for check in verdict.checks:
        case = ET.SubElement(
            suite,
            "testcase",
            {
                "classname": f"memprobe.gate.{check.source}",
                "name": f"{check.kind}: {check.case}",
                "time": "0",
            },
        )
        detail = describe(check)
        if check.rule:
            detail = f"rule {check.source}: {check.rule}\ncase {check.case_id}\n{detail}"
        if check.passed:
            ET.SubElement(case, "system-out").text = detail
        else:
            failure = ET.SubElement(
                case, "failure", {"message": describe(check), "type": check.kind}
            )
            failure.text = detail
    ET.indent(root)
    return root


# Characters XML 1.0 cannot hold at all (ElementTree writes them and the file no longer
# parses): control codes such as the ANSI colours in a CUDA or Triton error text.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_text(text: str) -> str:
    """``text`` with the characters XML cannot hold shown as ``\\x1b`` escapes."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def write_junit(path: Path, verdict: Verdict) -> None:
    from memprobe.io.files import write_atomic

    text = xml_text(ET.tostring(junit_tree(verdict), encoding="unicode"))
    write_atomic(path, '<?xml version="1.0" encoding="utf-8"?>\n' + text + "\n", what="JUnit file")
