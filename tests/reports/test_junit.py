import xml.etree.ElementTree as ET

import numpy as np

from compress.reports.junit import junit_xml
from tests.synthetic_report import flip, make_report, measurement, recipe_dict, write_run

LABELS = np.array([0, 1] * 100)


def cases(xml: str) -> tuple[ET.Element, dict[tuple[str, str], ET.Element]]:
    root = ET.fromstring(xml)
    return root, {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}


def test_one_case_per_budget_check_per_candidate():
    res = {"baseline": measurement(LABELS, LABELS),
           "good": measurement(LABELS, LABELS, size_mb=50),
           "bad": measurement(flip(LABELS, 20), LABELS, p50=50, p95=80, size_mb=50)}
    report = make_report(res, LABELS, recipe_dict(latency_p95_ms=20.0))
    root, cs = cases(junit_xml(report))
    suite = root.find("testsuite")
    # 2 candidates x 3 checks + the decision; the baseline is not a candidate
    assert suite.get("tests") == "7" and len(cs) == 7
    assert not any("baseline" in c for c, _ in cs)
    assert cs[("compress.synthetic.good", "accuracy budget (cpu)")].find("failure") is None
    assert cs[("compress.synthetic.bad", "accuracy budget (cpu)")].find("failure") is not None
    assert "exceeds the SLO" in cs[("compress.synthetic.bad", "latency SLO (cpu)")].find("failure").get("message")
    assert cs[("compress.synthetic.good", "size limit (cpu)")].find("skipped") is not None
    assert suite.get("failures") == "2" and suite.get("skipped") == "2"
    assert cs[("compress.synthetic", "decision")].find("failure") is None


def test_decision_case_fails_when_nothing_is_within_budget_and_errors_show():
    res = {"baseline": measurement(LABELS, LABELS), "bad": measurement(flip(LABELS, 20), LABELS),
           "broken": {"ok": False, "error": "RuntimeError: boom"}}
    report = make_report(res, LABELS)
    assert report["decision"]["exit_code"] == 3
    root, cs = cases(junit_xml(report))
    fail = cs[("compress.synthetic", "decision")].find("failure")
    assert fail is not None and "closest: bad" in fail.get("message")
    assert cs[("compress.synthetic.broken", "accuracy budget (cpu)")].find("error") is not None
    assert root.find("testsuite").get("errors") == "3"


def test_write_reports_writes_junit_next_to_the_json(tmp_path):
    res = {"baseline": measurement(LABELS, LABELS), "q": measurement(LABELS, LABELS)}
    write_run(tmp_path, make_report(res, LABELS), res, LABELS)
    for name in ("report.json", "report.md", "report.html", "junit.xml"):
        assert (tmp_path / name).is_file()
    ET.parse(tmp_path / "junit.xml")  # well-formed
