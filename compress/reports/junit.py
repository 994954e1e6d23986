"""junit.xml: the budget checks as test cases, so CI systems show the gate natively.

One test case per budget check of every candidate variant on the deciding device
(the quality budget, named after the task's metric: `accuracy budget`; latency SLO; size
limit; a limit the budget does not set is a skipped case), plus one `decision` case that
fails when no compressed variant is within budget
(the run's exit code 3). Rendered from report.json like the other reports.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from compress.decision.decide import budget_checks
from compress.reports.report_json import Report, as_report

JUNIT_XML = "junit.xml"


# Characters XML 1.0 cannot hold at all, even escaped: a control character in an error
# message would make the whole file unparsable (and the CI's test report empty).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _text(value) -> str:
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", str(value))


def junit_xml(report: "Report | dict") -> str:
    report = as_report(report)
    budget = report.budget
    d = report.decision
    suite_name = f"compress.{report.recipe}"
    cases: list[ET.Element] = []
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}

    def case(classname: str, name: str, status: str, message: str) -> None:
        classname, name, message = _text(classname), _text(name), _text(message)
        el = ET.Element("testcase", {"classname": classname, "name": name, "time": "0"})
        if status == "fail":
            ET.SubElement(el, "failure", {"message": message, "type": "budget"}).text = message
            counts["failures"] += 1
        elif status == "error":
            ET.SubElement(el, "error", {"message": message, "type": "benchmark"}).text = message
            counts["errors"] += 1
        elif status == "skipped":
            ET.SubElement(el, "skipped", {"message": message})
            counts["skipped"] += 1
        else:
            ET.SubElement(el, "system-out").text = message
        counts["tests"] += 1
        cases.append(el)

    for r in report.rows:
        if r.device != d.device or r.verdict in ("baseline", "reported"):
            continue
        checks = r.checks or budget_checks(r, budget, report.metric)
        for c in checks:
            case(f"{suite_name}.{r.id}", f"{c.name} ({r.device})", c.status, c.message)

    if d.selected:
        case(suite_name, "decision", "pass", f"deploy {d.selected} ({d.objective} on {d.device})")
    else:
        bf = d.best_failed
        msg = "no compressed variant is within budget" + (
            f"; closest: {bf.id} ({'; '.join(bf.reasons)})" if bf else "")
        case(suite_name, "decision", "fail", msg)

    root = ET.Element("testsuites", {"name": "compress", **{k: str(v) for k, v in counts.items() if k != "skipped"}})
    suite = ET.SubElement(root, "testsuite", {"name": suite_name, **{k: str(v) for k, v in counts.items()}, "time": "0"})
    suite.extend(cases)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
