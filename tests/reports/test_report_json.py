"""report.json as typed records: written by alias without unset fields, read back through
the same records, byte for byte; schema 1 (no task block) to 5 (a row's examples_to_pass) all read."""

import json

import numpy as np
import pytest

from compress.core.errors import CompressError
from compress.bench.measure import Measurement
from compress.reports.render import write_reports
from compress.reports.report_json import SCHEMA_VERSION, Report, read_report
from tests.synthetic_report import flip, make_report, measurement

LABELS = np.array([0, 1] * 50)


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    monkeypatch.setattr("compress.reports.html.render", lambda report: "<html></html>")


def _report(**extra) -> dict:
    res = {"baseline": measurement(LABELS, LABELS), "int8": measurement(flip(LABELS, 2), LABELS, size_mb=25),
           "broken": {"ok": False, "error": "boom"}}
    return {**make_report(res, LABELS), **extra}


def test_a_measurement_goes_through_json_unchanged():
    m = Measurement.model_validate(measurement(LABELS, LABELS, routed_share=0.2))
    again = Measurement.model_validate_json(m.dump_json())
    assert again == m and again.dump() == m.dump()
    assert "accuracy" in m.dump() and "quality" not in m.dump() and m.quality == 100.0
    assert "error" not in m.dump() and "paired_speedup" not in m.dump()  # never set: not written
    failed = Measurement(ok=False, error="boom")
    assert json.loads(failed.dump_json()) == {"ok": False, "error": "boom"}
    with pytest.raises(ValueError):
        Measurement.model_validate({**m.dump(), "acuracy": 1.0})  # a misspelt figure is refused, not ignored


def test_report_json_reads_back_into_the_same_file(tmp_path):
    write_reports(_report(), tmp_path)
    first = (tmp_path / "report.json").read_text()
    report = read_report(tmp_path)
    assert isinstance(report, Report) and report.rows[1].quality == 98.0 and report.metric.name == "accuracy"
    (tmp_path / "again").mkdir()
    write_reports(report, tmp_path / "again")
    assert (tmp_path / "again" / "report.json").read_text() == first
    data = json.loads(first)
    row = data["rows"][1]
    assert "accuracy" in row and "quality" not in row and row["delta_ci95"] == list(row["delta_ci95"])
    failed = data["rows"][2]
    assert "accuracy" not in failed and failed["error"] == "boom"  # no figure keys on a failed row
    assert data["schema_version"] == 1 and "task" not in data  # a schema 1 report stays one


def test_schema_2_carries_the_task_and_older_schemas_are_sequence_classification(tmp_path):
    from compress.core.task import get_task

    assert SCHEMA_VERSION == 8
    info = get_task().info().model_dump()
    write_reports(_report(schema_version=2, task=info), tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["task"]["metric"] == {"name": "accuracy", "direction": "higher", "unit": "%", "label": "acc %",
                                      "delta_unit": "points", "better": "more accurate", "best": "most accurate"}
    assert list(data)[:2] == ["schema_version", "task"]
    assert read_report(tmp_path).task_info.name == "sequence-classification"
    assert Report.model_validate(_report()).task_info == get_task().info()


def test_a_causal_lm_report_keys_its_quality_by_perplexity_and_reads_it_back(tmp_path):
    """Schema 3: the quality figure is keyed by the task's metric, so a causal-LM row says
    `perplexity`, never `accuracy`; reading the file back gives the same figures."""
    from compress.core.task import Metric, TaskInfo

    info = TaskInfo(name="causal-lm", metric=Metric(name="perplexity", direction="lower", unit="", label="ppl",
                                                    delta_unit="%"), throughput_unit="tok/s").model_dump()
    report = Report.model_validate(_report(schema_version=3, task=info))
    data = report.dump()
    assert all("accuracy" not in r for r in data["rows"])
    assert all("perplexity" in r for r in data["rows"] if r["ok"])
    again = Report.model_validate(json.loads(json.dumps(data)))
    assert [r.quality for r in again.rows] == [r.quality for r in report.rows]


@pytest.mark.parametrize("edit,problem", [
    (lambda r: r["rows"][1].update(acuracy=1.0), "rows.1.acuracy: Extra inputs are not permitted"),
    (lambda r: r["rows"][1].pop("accuracy"), "rows[1]: a row marked ok lacks accuracy"),
    (lambda r: r["decision"].update(best_failed={"id": 3}), "decision.best_failed.id"),
    (lambda r: r.update(schema_version=9), "not a compress report (schema_version 1 or 2 or 3 or 4 or 5 or 6 or 7 or 8)"),
])
def test_a_malformed_report_is_one_line(tmp_path, edit, problem):
    report = _report()
    edit(report)
    (tmp_path / "report.json").write_text(json.dumps(report))
    with pytest.raises(CompressError) as exc:
        read_report(tmp_path)
    assert problem in str(exc.value) and "\n" not in str(exc.value)


def test_the_decisions_stability_goes_through_report_json(tmp_path):
    """Schema 4: `decision.stability`, the decision replayed on resamples of the eval split;
    a report without it (schema 3 and before) reads as before."""
    rep = _report(schema_version=4)
    rep["decision"]["stability"] = [{"selected": "int8", "share": 0.75}, {"selected": None, "share": 0.25}]
    rep["decision"]["stability_resamples"] = 200
    write_reports(rep, tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["decision"]["stability"] == [{"selected": "int8", "share": 0.75}, {"selected": None, "share": 0.25}]
    back = read_report(tmp_path).decision
    assert [(s.selected, s.share) for s in back.stability] == [("int8", 0.75), (None, 0.25)]
    assert back.stability_resamples == 200
    (tmp_path / "old").mkdir()
    write_reports(_report(schema_version=3), tmp_path / "old")
    old = json.loads((tmp_path / "old" / "report.json").read_text())
    assert "stability" not in old["decision"] and read_report(tmp_path / "old").decision.stability is None
    with pytest.raises(ValueError):
        Report.model_validate({**rep, "decision": {**rep["decision"], "stability": [{"selected": "int8"}]}})


def test_a_rows_examples_to_pass_goes_through_report_json(tmp_path):
    """Schema 5: `examples_to_pass` on a row the interval gate rejects with its point estimate
    within the budget (-2 points against a 3-point budget, its interval far below -3)."""
    from tests.synthetic_report import recipe_dict

    res = {"baseline": measurement(LABELS, LABELS), "int8": measurement(flip(LABELS, 2), LABELS, size_mb=25)}
    rep = make_report(res, LABELS, recipe_dict(gate_on="ci_lower", max_accuracy_drop=3.0))
    write_reports({**rep, "schema_version": SCHEMA_VERSION}, tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    n = data["rows"][1]["examples_to_pass"]
    assert data["schema_version"] == SCHEMA_VERSION and n > len(LABELS)
    assert read_report(tmp_path).rows[1].examples_to_pass == n
    assert "examples_to_pass" not in data["rows"][0]  # the baseline: never set, never written


def test_a_cascades_cost_against_its_large_member_goes_through_report_json(tmp_path):
    """Schema 6: a cascade row's `large_alone_usd_per_1k` (its large member timed alone in the
    cascade's process), `cost_vs_large` and `cost_vs_large_paired`."""
    from tests.synthetic_report import recipe_dict, variants

    res = {"baseline": measurement(LABELS, LABELS),
           "casc": measurement(LABELS, LABELS, throughput=400.0, routed_share=0.2,
                               large_alone=[{"batch_size": 32, "throughput": 500.0, "p95_ms": 30.0}])}
    meta = variants("baseline", "casc")
    meta[1]["source"], meta[1]["refs"] = "baseline", {"large": "baseline"}
    rep = make_report(res, LABELS, recipe_dict(), meta=meta)
    write_reports({**rep, "schema_version": SCHEMA_VERSION}, tmp_path)
    row = json.loads((tmp_path / "report.json").read_text())["rows"][1]
    assert row["cost_vs_large_paired"] is True and row["cost_vs_large"] == pytest.approx(500.0 / 1200.0)
    back = read_report(tmp_path).rows[1]
    assert (back.large_alone_usd_per_1k, back.cost_vs_large) == (row["large_alone_usd_per_1k"], row["cost_vs_large"])
    assert "cost_vs_large" not in json.loads((tmp_path / "report.json").read_text())["rows"][0]


def test_money_keeps_significant_digits_at_every_scale():
    from compress.reports.report_json import money

    assert money(0.0000452) == "0.0000452"
    assert money(0.00011) == "0.000110"
    assert money(0.0123456) == "0.0123"
    assert money(1.23456) == "1.23"
    assert money(12345.6) == "12,346"
    assert money(None) == "-" and money(0.0) == "0"


def test_reports_and_model_cards_are_never_written_through_links(tmp_path):
    """A run folder from a restored cache or a shared disk may hold links where the reports,
    their `.part` temporaries or a model card's temporary go: the files they point to,
    outside the run folder, stay as they were, and the reports become regular files (so
    that a later run does not write through them again)."""
    from compress.data.artifacts import MARKER
    from compress.reports.model_card import write_model_cards

    run = tmp_path / "run"
    (run / "int8").mkdir(parents=True)
    (run / "int8" / MARKER).write_text("{}")
    target = tmp_path / "precious.txt"
    target.write_text("precious")
    for name in ("report.md", "report.json.part", "junit.xml.part", ".int8.README.md.part"):
        (run / name).symlink_to(target)
    (run / "int8" / "README.md").symlink_to(target)
    write_reports(_report(), run)
    assert write_model_cards(_report(), run) == [run / "int8" / "README.md"]
    assert target.read_text() == "precious"
    for path in (run / "report.md", run / "report.json", run / "junit.xml", run / "int8" / "README.md"):
        assert path.is_file() and not path.is_symlink(), path
    assert not list(run.glob("*.part")) and not list(run.glob(".*.part"))


def _written(tmp_path, report: dict, text: str | None = None):
    (tmp_path / "report.json").write_text(text if text is not None else json.dumps(report))
    return tmp_path


@pytest.mark.parametrize("figure", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_report_with_a_non_finite_figure_is_refused_in_one_line(tmp_path, figure):
    """compress writes null for a figure that is not finite: a NaN or an infinity in
    report.json was put there since, and every comparison with it is false (a gate on it
    would pass or fail on nothing). (`gate`, `report` and `compare`: tests/test_hostile_inputs.py.)"""
    report = _report()
    report["rows"][0]["latency_ms"]["p50"] = 12345.678
    text = json.dumps(report).replace("12345.678", figure)
    run = _written(tmp_path, {}, text)
    with pytest.raises(CompressError) as exc:
        read_report(run)
    assert "rows.0.latency_ms.p50 is not a finite number" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("version,edit,key,first", [
    (1, lambda r: r.update(task=get_task_info()), "task", 2),
    (2, lambda r: r["rows"][1].update(examples_to_pass=400), "rows.1.examples_to_pass", 5),
    (3, lambda r: r["decision"].update(stability_resamples=200), "decision.stability_resamples", 4),
    (5, lambda r: r["rows"][1].update(cost_vs_large=0.5), "rows.1.cost_vs_large", 6),
])
def test_a_report_whose_schema_version_does_not_match_its_content_is_refused(tmp_path, version, edit, key, first):
    """A report that claims an older schema than its content (a field that version never
    wrote) was edited or forged: reading it under the older rules would misread it."""
    report = _report(schema_version=version)
    edit(report)
    run = _written(tmp_path, report)
    with pytest.raises(CompressError) as exc:
        read_report(run)
    assert f"schema_version {version} does not match its content: {key} first appears in schema {first}" \
        in str(exc.value)
    report["schema_version"] = SCHEMA_VERSION  # the same content under the version that writes it reads
    assert read_report(_written(tmp_path, report)).schema_version == SCHEMA_VERSION


def test_a_schema_version_that_is_not_an_integer_is_refused(tmp_path):
    for version in (True, 1.0, "1"):
        with pytest.raises(CompressError, match="not a compress report"):
            read_report(_written(tmp_path, _report(schema_version=version)))


def get_task_info() -> dict:
    from compress.core.task import get_task

    return get_task().info().model_dump()
