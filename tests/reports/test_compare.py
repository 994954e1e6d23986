import copy

import numpy as np
import pytest

from compress.reports.compare import compare, markdown, timing_noise
from tests.synthetic_report import flip, make_report, measurement, write_run

LABELS = np.array([0, 1] * 200)


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    """The comparison reads report.json only: skip drawing the HTML plots (seconds each)."""
    monkeypatch.setattr("compress.reports.html.render", lambda report: "<html></html>")


def results(**over):
    base = {"baseline": measurement(LABELS, LABELS, p50=10.0, p95=11.0, throughput=100, size_mb=100),
            "int8": measurement(flip(LABELS, 4), LABELS, p50=5.0, p95=5.5, throughput=200, size_mb=30)}
    for vid, changes in over.items():
        base[vid] = {**copy.deepcopy(base[vid]), **changes}
    return base


def runs(tmp_path, res_b, cpu_b="Test CPU", res_a=None):
    res_a = res_a or results()
    a = write_run(tmp_path / "a", make_report(res_a, LABELS), res_a, LABELS)
    b = write_run(tmp_path / "b", make_report(res_b, LABELS, cpu_model=cpu_b), res_b, LABELS)
    return a, b


def row(cmp, vid):
    return next(r for r in cmp["rows"] if r["id"] == vid)


def test_timing_noise_floor_and_spread():
    assert timing_noise(0.01, 0.02) == 0.05
    assert timing_noise(0.3, 0.1) == 0.3
    assert timing_noise(float("inf")) == 0.05  # unusable spreads are ignored


def test_identical_runs_have_no_regression(tmp_path, cli):
    a, b = runs(tmp_path, results())
    cmp = compare(a, b)
    assert cmp["regressions"] == 0
    r = row(cmp, "int8")
    assert r["quality"]["method"] == "paired bootstrap" and r["quality"]["ci95"] == [0.0, 0.0]
    code, out, err = cli("compare", a, b, "--fail-on-regression")
    assert code == 0, err


def test_accuracy_drop_beyond_the_interval_is_flagged(tmp_path, cli):
    worse = measurement(flip(LABELS, 40, seed=3), LABELS, p50=5.0, p95=5.5, throughput=200, size_mb=30)
    a, b = runs(tmp_path, results(int8=worse))
    cmp = compare(a, b)
    r = row(cmp, "int8")
    assert r["quality"]["change"] < -8 and r["quality"]["ci95"][1] < 0
    assert any(x.startswith("accuracy") for x in r["regressions"])
    code, out, _ = cli("compare", a, b)
    assert code == 0  # flagged, but only --fail-on-regression fails
    code, out, _ = cli("compare", a, b, "--fail-on-regression", "--markdown", tmp_path / "cmp.md")
    assert code == 3 and "REGRESSION" in out
    assert "Regressions beyond noise" in (tmp_path / "cmp.md").read_text()


def test_small_accuracy_change_within_noise_is_not_flagged(tmp_path):
    slightly = measurement(flip(LABELS, 5, seed=4), LABELS, p50=5.0, p95=5.5, throughput=200, size_mb=30)
    a, b = runs(tmp_path, results(int8=slightly))
    assert not row(compare(a, b), "int8")["regressions"]


def test_unpaired_interval_without_predictions(tmp_path):
    worse = measurement(flip(LABELS, 60, seed=3), LABELS, p50=5.0, p95=5.5, throughput=200, size_mb=30)
    a, b = runs(tmp_path, results(int8=worse))
    for d in (a, b):
        for f in (d / "bench").glob("*.cpu.json"):
            f.unlink()
    r = row(compare(a, b), "int8")
    assert r["quality"]["method"] == "unpaired normal approximation"
    assert r["regressions"]


def test_an_edited_measurement_is_not_used_for_the_paired_interval(tmp_path):
    """The per-example predictions in bench/ are used only while their checksum holds: one
    edited since the run (predictions made to match the labels) falls back to the unpaired
    interval of the report's own figures."""
    import json

    worse = measurement(flip(LABELS, 60, seed=3), LABELS, p50=5.0, p95=5.5, throughput=200, size_mb=30)
    a, b = runs(tmp_path, results(int8=worse))
    assert row(compare(a, b), "int8")["quality"]["method"] != "unpaired normal approximation"
    cached = b / "bench" / "int8.cpu.json"
    edited = json.loads(cached.read_text())
    edited["predictions"] = LABELS.tolist()
    cached.write_text(json.dumps(edited))
    assert row(compare(a, b), "int8")["quality"]["method"] == "unpaired normal approximation"


@pytest.mark.parametrize("p50,p95,flagged", [
    (5.6, 6.0, True),    # +12%, spreads about 10%: beyond noise
    (5.2, 5.7, False),   # +4%: under the 5% floor
    (6.5, 10.0, False),  # +30%, but B's own p95 lies 54% above its p50: within noise
])
def test_latency_regression_against_the_spread(tmp_path, p50, p95, flagged):
    changed = measurement(flip(LABELS, 4), LABELS, p50=p50, p95=p95, throughput=200, size_mb=30)
    a, b = runs(tmp_path, results(int8=changed))
    regs = row(compare(a, b), "int8")["regressions"]
    assert any(x.startswith("p50 latency") for x in regs) == flagged


def test_size_growth_is_flagged_and_other_machines_are_not_timed(tmp_path):
    bigger = measurement(flip(LABELS, 4), LABELS, p50=9.0, p95=9.5, throughput=200, size_mb=40)
    a, b = runs(tmp_path, results(int8=bigger), cpu_b="Other CPU")
    cmp = compare(a, b)
    regs = row(cmp, "int8")["regressions"]
    assert any(x.startswith("size") for x in regs)
    assert not any(x.startswith("p50") for x in regs)  # different machines: timings not flagged
    assert any("different machines" in n for n in cmp["notes"])


def test_added_removed_and_failed_variants(tmp_path):
    res_b = results()
    res_b["new"] = res_b.pop("int8")
    res_a = results()
    res_a["new"] = copy.deepcopy(res_a["int8"])
    res_b["baseline"] = res_b["baseline"]
    a, b = runs(tmp_path, res_b, res_a=res_a)
    cmp = compare(a, b)
    assert cmp["removed"] == ["int8 (cpu)"] and cmp["added"] == []
    res_b2 = results(int8={"ok": False, "error": "boom"})
    a, b = runs(tmp_path / "2", res_b2)
    cmp = compare(a, b)
    assert "benchmark now fails" in row(cmp, "int8")["regressions"][0]
    assert "int8" in markdown(cmp)


def test_runs_of_different_benchmark_methods_are_noted(tmp_path):
    from compress.bench.benchmark import METHOD

    res = results()
    old = make_report(res, LABELS)  # a report from before the method was recorded
    old["manifest"].pop("benchmark_method", None)
    new = make_report(res, LABELS)
    new["manifest"]["benchmark_method"] = METHOD
    a = write_run(tmp_path / "a", old, res, LABELS)
    b = write_run(tmp_path / "b", new, res, LABELS)
    assert any(f"different benchmark methods (1 vs {METHOD}" in n for n in compare(a, b)["notes"])
    c = write_run(tmp_path / "c", new, res, LABELS)
    assert not any("benchmark methods" in n for n in compare(b, c)["notes"])
