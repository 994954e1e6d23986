import re
import shutil
import subprocess

import numpy as np
import pytest

from compress.reports.html import _pareto_front, render
from tests.synthetic_report import flip, make_report, measurement, recipe_dict, write_run

LABELS = np.array([0, 1] * 100)


def report(**budget):
    res = {"baseline": measurement(LABELS, LABELS, p50=10, p95=12, throughput=100, size_mb=400),
           "int8": measurement(flip(LABELS, 1), LABELS, p50=6, p95=8, throughput=180, size_mb=110),
           "casc": measurement(LABELS, LABELS, p50=7, p95=14, throughput=150, size_mb=510, routed_share=0.2),
           "bad": measurement(flip(LABELS, 30), LABELS, p50=3, p95=4, throughput=400, size_mb=60),
           "broken": {"ok": False, "error": "RuntimeError: boom <b>"}}
    return make_report(res, LABELS, recipe_dict(**budget))


def test_html_is_self_contained_with_plots_table_reasons_and_manifest():
    html = render(report(latency_p95_ms=40.0))
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert html.count("<svg") == 4  # three Pareto plots and one latency/throughput curve (cpu)
    # nothing to fetch: no scripts, stylesheets, images or fonts from elsewhere
    assert not re.search(r"<(script|link|img|iframe)\b", html)
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", html)
    assert "url(http" not in html
    assert "Deploy <b>int8</b>" in html
    assert "RuntimeError: boom &lt;b&gt;" in html  # escaped
    assert "accuracy drop 15.00 points exceeds the budget" in html  # why 'bad' lost
    assert "20%" in html  # the cascade's share sent to the large model
    assert "Manifest" in html and "Test CPU" in html


def test_html_says_when_nothing_is_within_budget():
    html = render(report(max_size_mb=10.0))
    assert "No compressed variant is within budget" in html


def test_pareto_front():
    pts = [(1, 80), (2, 85), (3, 84), (4, 90), (0.5, 70), (2, 81)]
    assert _pareto_front(pts) == [(0.5, 70), (1, 80), (2, 85), (4, 90)]


def test_compress_report_re_renders_the_html(tmp_path, cli):
    res = {"baseline": measurement(LABELS, LABELS), "q": measurement(LABELS, LABELS)}
    write_run(tmp_path, make_report(res, LABELS), res, LABELS)
    (tmp_path / "report.html").unlink()
    (tmp_path / "junit.xml").unlink()
    code, out, err = cli("report", tmp_path)
    assert code == 0, err
    assert (tmp_path / "report.html").is_file() and (tmp_path / "junit.xml").is_file()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed")
def test_report_renders_in_a_headless_browser(tmp_path):
    from PIL import Image

    page = tmp_path / "report.html"
    page.write_text(render(report(latency_p95_ms=40.0, max_size_mb=600.0)), encoding="utf-8")
    shot = tmp_path / "report.png"
    cmd = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
           f"--screenshot={shot}", "--window-size=1400,2000", page.resolve().as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120)
    print(f"report screenshot: {shot}")
    assert shot.is_file()
    img = Image.open(shot).convert("RGB")
    assert img.size == (1400, 2000)
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, plots and table backgrounds, not a blank page
    # the plots' verdict colours are drawn (the selected star's green, the rejected red)
    rgb = {c for _, c in colours}
    assert (0x1A, 0x98, 0x50) in rgb and (0xD7, 0x30, 0x27) in rgb
