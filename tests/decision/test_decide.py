import numpy as np
import pytest

from compress.decision.decide import Row, budget_checks, build_rows, decide, operating_point, paired_bootstrap, usd_per_1k
from compress.core.errors import EXIT_BUDGET, EXIT_OK
from compress.bench.measure import BatchFigures
from tests.synthetic_report import batches, flip, make_report, measurement, recipe_dict, typed, variants

LABELS = np.array([0, 1] * 200)  # 400 eval examples


def curve():
    return [
        BatchFigures(batch_size=1, throughput=200.0, p95_ms=6.0, p50_ms=5.0),
        BatchFigures(batch_size=8, throughput=900.0, p95_ms=12.0, p50_ms=9.0),
        BatchFigures(batch_size=32, throughput=1500.0, p95_ms=40.0, p50_ms=30.0),
    ]


# ------------------------------------------------------------------ operating point, $/1K


def test_operating_point_without_slo_is_best_throughput():
    assert operating_point(curve(), None).batch_size == 32


def test_operating_point_is_the_cheapest_batch_within_the_slo():
    assert operating_point(curve(), 15.0).batch_size == 8
    assert operating_point(curve(), 12.0).batch_size == 8  # the SLO is inclusive
    assert operating_point(curve(), 6.0).batch_size == 1
    assert operating_point(curve(), 5.0) is None


def test_operating_point_tie_goes_to_the_smaller_batch_and_skips_unmeasured():
    c = curve()
    c[2].throughput = 900.0
    assert operating_point(c, None).batch_size == 8
    assert operating_point([BatchFigures(batch_size=1, throughput=0.0, p95_ms=1.0)], None) is None


def test_usd_per_1k():
    # 3.6 USD/hour is 0.001 USD/s; at 1 sequence/s, 1,000 sequences cost 1 USD.
    assert usd_per_1k(3.6, 1.0) == pytest.approx(1.0)
    assert usd_per_1k(3.6, 4.0) == pytest.approx(0.25)
    assert usd_per_1k(0.17, 850.0) == pytest.approx(0.17 / 3600 / 850 * 1000)
    assert usd_per_1k(0.17, 0.0) is None


def test_cost_uses_the_operating_point_under_the_slo():
    recipe = recipe_dict(latency_p95_ms=25.0)
    res = typed({(v, "cpu"): measurement(LABELS, LABELS) for v in ("baseline", "q")})
    rows = build_rows(variants("baseline", "q"), res, LABELS, recipe)
    q = next(r for r in rows if r.id == "q")
    # batches(): b8 has p95 6 * 8**0.6 = 20.9 ms (within 25), b32 48 ms (not)
    assert q.operating_point.batch_size == 8
    assert q.usd_per_1k == pytest.approx(usd_per_1k(0.17, q.operating_point.throughput))
    rows = build_rows(variants("baseline", "q"), res, LABELS, recipe_dict())
    assert next(r for r in rows if r.id == "q").operating_point.batch_size == 32


# ------------------------------------------------------------------ paired bootstrap


def _synthetic_pair(n, acc_a, acc_b, rng):
    """Correctness of two models on n examples, drawn around true accuracies acc_a, acc_b."""
    a = rng.random(n) < acc_a
    b = rng.random(n) < acc_b
    return a, b


def test_paired_bootstrap_covers_the_true_delta():
    rng = np.random.default_rng(0)
    true_delta = (0.80 - 0.85) * 100
    covered = 0
    for seed in range(60):
        a, b = _synthetic_pair(600, 0.85, 0.80, rng)
        lo, hi = paired_bootstrap(a, b, 400, seed=seed)
        covered += lo <= true_delta <= hi
        assert lo < hi
    assert covered >= 52  # a 95% interval: about 57 of 60; well above chance


def test_paired_bootstrap_is_narrower_with_more_data():
    rng = np.random.default_rng(1)
    small = paired_bootstrap(*_synthetic_pair(200, 0.9, 0.88, rng), 500)
    large = paired_bootstrap(*_synthetic_pair(5000, 0.9, 0.88, rng), 500)
    assert (large[1] - large[0]) < 0.5 * (small[1] - small[0])  # about sqrt(25) = 5x narrower


def test_paired_bootstrap_uses_the_pairing():
    # b differs from a on 2 of 400 examples: the paired interval is tight around -0.5 points,
    # far tighter than two independent 90% accuracies would allow (about +-4 points).
    a = np.ones(400, dtype=bool)
    a[:40] = False
    b = a.copy()
    b[100:102] = False
    lo, hi = paired_bootstrap(a, b, 500)
    assert -1.5 < lo <= -0.5 <= hi <= 0.0
    assert paired_bootstrap(a, a, 100) == (0.0, 0.0)


# ------------------------------------------------------------------ decide


def run_decide(results: dict, **budget):
    report = make_report(results, LABELS, recipe_dict(**budget))
    return report["decision"], {r["id"]: r for r in report["rows"]}


def three_variants():
    return {
        "baseline": measurement(LABELS, LABELS, p50=10, p95=12, throughput=100, size_mb=400),
        "cheap": measurement(LABELS, LABELS, p50=6, p95=9, throughput=400, size_mb=200),
        "fast": measurement(LABELS, LABELS, p50=3, p95=4, throughput=300, size_mb=300),
        "small": measurement(LABELS, LABELS, p50=8, p95=10, throughput=150, size_mb=50),
    }


@pytest.mark.parametrize("objective,expected", [("min_cost", "cheap"), ("min_latency", "fast"), ("min_size", "small")])
def test_decide_picks_by_objective(objective, expected):
    d, rows = run_decide(three_variants(), objective=objective)
    assert d["selected"] == expected and d["exit_code"] == EXIT_OK
    assert rows[expected]["verdict"] == "selected"
    assert rows["baseline"]["verdict"] == "baseline"
    for vid in {"cheap", "fast", "small"} - {expected}:
        assert rows[vid]["verdict"] == "within budget"
        assert rows[vid]["reasons"] and f"'{expected}'" in rows[vid]["reasons"][0]


def test_decide_gives_reasons_for_every_loser():
    res = three_variants()
    res["cheap"] = measurement(flip(LABELS, 40), LABELS, p50=6, p95=9, throughput=400)  # -10 points
    res["fast"] = measurement(LABELS, LABELS, p50=30, p95=50, throughput=300)
    res["small"]["size_bytes"] = 900e6
    res["broken"] = {"ok": False, "error": "RuntimeError: boom"}
    d, rows = run_decide(res, latency_p95_ms=20.0, max_size_mb=500.0)
    assert d["selected"] is None and d["exit_code"] == EXIT_BUDGET
    assert "accuracy drop 10.00 points exceeds the budget of 1.00" in rows["cheap"]["reasons"]
    assert any("exceeds the SLO of 20.00 ms" in x for x in rows["fast"]["reasons"])
    assert any("size 900.0 MB exceeds the limit of 500.0 MB" in x for x in rows["small"]["reasons"])
    assert rows["broken"]["verdict"] == "rejected" and "boom" in rows["broken"]["reasons"][0]
    assert all(rows[v]["verdict"] == "rejected" for v in ("cheap", "fast", "small"))


def test_no_variant_within_budget_exits_3_and_names_the_closest():
    res = {
        "baseline": measurement(LABELS, LABELS),
        "bad": measurement(flip(LABELS, 40, seed=1), LABELS),  # -10 points
        "less_bad": measurement(flip(LABELS, 12, seed=2), LABELS),  # -3 points
    }
    d, rows = run_decide(res)
    assert d["exit_code"] == EXIT_BUDGET and d["selected"] is None
    bf = d["best_failed"]
    assert bf["id"] == "less_bad" and bf["delta"] == pytest.approx(-3.0)
    assert bf["reasons"] == rows["less_bad"]["reasons"]
    assert any("'less_bad'" in n for n in d["notes"])


def test_gate_on_ci_lower_is_stricter_than_the_point_estimate():
    # -0.75 points measured, but with an interval reaching below -1: passes on the point
    # estimate, fails on the lower bound.
    res = {"baseline": measurement(LABELS, LABELS), "q": measurement(flip(LABELS, 3), LABELS)}
    d_point, rows = run_decide(res, gate_on="point")
    assert d_point["selected"] == "q"
    lo = rows["q"]["delta_ci95"][0]
    assert lo < -1.0 < rows["q"]["delta"]
    d_ci, rows = run_decide(res, gate_on="ci_lower")
    assert d_ci["selected"] is None and d_ci["exit_code"] == EXIT_BUDGET
    assert "lower 95% bound of the accuracy delta" in rows["q"]["reasons"][0]


def test_budget_device_not_benchmarked_decides_on_cpu():
    d, _ = run_decide(three_variants(), device="cuda")
    assert d["device"] == "cpu" and any("cuda was not benchmarked" in n for n in d["notes"])


def test_missing_baseline_on_the_device_is_a_reason_not_a_crash():
    recipe = recipe_dict()
    res = typed({("baseline", "cpu"): {"ok": False, "error": "boom"}, ("q", "cpu"): measurement(LABELS, LABELS)})
    rows = build_rows(variants("baseline", "q"), res, LABELS, recipe)
    d = decide(rows, recipe, ["cpu"])
    assert d.selected is None
    q = next(r for r in rows if r.id == "q")
    assert "baseline was not measured" in q.reasons[0]


def test_no_price_is_a_reason_under_min_cost():
    recipe = recipe_dict()
    recipe.benchmark.prices = {}
    res = typed({(v, "cpu"): measurement(LABELS, LABELS) for v in ("baseline", "q")})
    rows = build_rows(variants("baseline", "q"), res, LABELS, recipe)
    d = decide(rows, recipe, ["cpu"])
    assert d.selected is None and "no usd_per_1k figure" in rows[1].reasons[0]


def test_budget_checks_report_skipped_limits_and_passes():
    _, rows = run_decide(three_variants())
    checks = {c["name"]: c["status"] for c in rows["cheap"]["checks"]}
    assert checks == {"accuracy budget": "pass", "latency SLO": "skipped", "size limit": "skipped"}
    budget = recipe_dict(latency_p95_ms=9.5, max_size_mb=250.0).budget
    _, rows = run_decide(three_variants(), latency_p95_ms=9.5, max_size_mb=250.0)
    fast = Row.model_validate(rows["fast"])
    checks = {c.name: c.status for c in budget_checks(fast, budget)}
    assert checks == {"accuracy budget": "pass", "latency SLO": "pass", "size limit": "fail"}
    assert rows["fast"]["checks"] == [c.dump() for c in budget_checks(fast, budget)]
    failed = Row(id="x", format="hf", ok=False, error="x", device="cpu")
    assert {c.status for c in budget_checks(failed, budget)} == {"error"}


def test_routed_share_reaches_the_row():
    res = {"baseline": measurement(LABELS, LABELS), "casc": measurement(LABELS, LABELS, routed_share=0.25)}
    _, rows = run_decide(res)
    assert rows["casc"]["routed_share"] == 0.25
    assert any("25% of the eval inputs" in n for n in rows["casc"]["notes"])
    assert "routed_share" not in rows["baseline"]


def test_a_cascade_row_compares_itself_with_both_members():
    from compress.decision.decide import compare_members

    res = {(v, "cpu"): measurement(LABELS, flip(LABELS, k), throughput=t, routed_share=0.3 if v == "casc" else None)
           for v, k, t in (("baseline", 0, 100.0), ("small", 20, 400.0), ("casc", 4, 250.0))}
    for r in res.values():
        if r.get("routed_share") is None:
            r.pop("routed_share")
    meta = variants("baseline", "small", "casc")
    meta[2]["source"], meta[2]["refs"] = "small", {"large": "baseline"}
    typed_rows = build_rows(meta, typed(res), LABELS, recipe_dict())
    rows = {r.id: r.dump() for r in typed_rows}
    casc = rows["casc"]
    assert casc["members"]["small"] == {"id": "small", "accuracy": rows["small"]["accuracy"],
                                        "usd_per_1k": rows["small"]["usd_per_1k"]}
    assert casc["members"]["large"]["id"] == "baseline"
    note = next(n for n in casc["notes"] if "went on to 'baseline'" in n)
    assert note.startswith("30% of the eval inputs") and f"{casc['accuracy']:.2f} against" in note
    assert f"({casc['usd_per_1k'] / rows['baseline']['usd_per_1k']:.2f}x the large member's)" in note
    # No figure of the large member timed beside the cascade: the ratio is the two rows'.
    assert casc["cost_vs_large"] == pytest.approx(casc["usd_per_1k"] / rows["baseline"]["usd_per_1k"])
    assert casc["cost_vs_large_paired"] is False and "large_alone_usd_per_1k" not in casc
    assert "members" not in rows["small"]
    lone = typed_rows[2].model_copy(update={"refs": {"large": "gone"}, "notes": []})
    compare_members([lone])  # a member without a row: no error
    assert lone.members == {"small": None, "large": None} and lone.notes[0].endswith("went on to 'gone'")


def test_a_cascade_is_costed_against_its_large_member_timed_beside_it():
    """The worker times the large member alone in the cascade's process (large_alone): the
    cost ratio reads that figure, not the large member's own row, measured at another time."""
    from compress.decision.decide import compare_members

    res = {(v, "cpu"): measurement(LABELS, LABELS, throughput=t, routed_share=0.3 if v == "casc" else None)
           for v, t in (("baseline", 100.0), ("small", 400.0), ("casc", 250.0))}
    for r in res.values():
        if r.get("routed_share") is None:
            r.pop("routed_share")
    # Timed beside the cascade the large member ran at 375/s (b32), faster than its row's 300/s
    # (b32 of batches(throughput=100)): the machine was quicker then, for both.
    res[("casc", "cpu")]["large_alone"] = [{"batch_size": 8, "throughput": 180.0, "p95_ms": 9.0},
                                          {"batch_size": 32, "throughput": 375.0, "p95_ms": 30.0}]
    meta = variants("baseline", "small", "casc")
    meta[2]["source"], meta[2]["refs"] = "small", {"large": "baseline"}
    rows = build_rows(meta, typed(res), LABELS, recipe_dict())
    casc, base = next(r for r in rows if r.id == "casc"), next(r for r in rows if r.id == "baseline")
    assert casc.large_alone_usd_per_1k == pytest.approx(usd_per_1k(0.17, 375.0))
    assert casc.cost_vs_large == pytest.approx(casc.usd_per_1k / usd_per_1k(0.17, 375.0))
    assert casc.cost_vs_large_paired is True
    unpaired = casc.usd_per_1k / base.usd_per_1k
    assert casc.cost_vs_large == pytest.approx(unpaired * 375.0 / 300.0)
    note = next(n for n in casc.notes if "went on to 'baseline'" in n)
    assert f"({casc.cost_vs_large:.2f}x the large member's timed alone in the cascade's process" in note
    assert f"{unpaired:.2f}x its own row's" in note
    # Under a latency SLO only batch 8 of the large member qualifies (p95 9 ms): its figure counts.
    slo = build_rows(meta, typed(res), LABELS, recipe_dict(latency_p95_ms=20.0))
    assert next(r for r in slo if r.id == "casc").large_alone_usd_per_1k == pytest.approx(usd_per_1k(0.17, 180.0))
    assert all(r.cost_vs_large is None for r in rows if r.id != "casc")
    compare_members(rows)  # idempotent figures on a second pass
    assert casc.cost_vs_large == pytest.approx(unpaired * 375.0 / 300.0)


def test_batches_helper_is_a_monotone_curve():
    b = batches(5.0, 6.0, 100.0)
    assert [x["batch_size"] for x in b] == [1, 8, 32]
    assert all(b[i]["p95_ms"] < b[i + 1]["p95_ms"] for i in range(2))


def test_accuracy_that_depends_on_the_batch_is_noted():
    steady = measurement(LABELS, LABELS)
    for b in steady["batches"]:
        b["accuracy"] = 100.0
    moody = measurement(LABELS, LABELS)
    for b, acc in zip(moody["batches"], (100.0, 97.5, 100.0)):
        b["accuracy"] = acc
    _, rows = run_decide({"baseline": steady, "moody": moody})
    assert not any("depends on the batch" in n for n in rows["baseline"]["notes"])
    [note] = [n for n in rows["moody"]["notes"] if "depends on the batch" in n]
    assert "batch 1 100.00%, batch 8 97.50%, batch 32 100.00%" in note and "scores batch 1" in note


def test_paired_rounds_give_the_speedups_and_the_input_ratio_is_their_quotient():
    recipe = recipe_dict()
    meta = variants("baseline", "student", "pruned", "lone")
    meta[2]["source"] = "student"
    res = {
        ("baseline", "cpu"): measurement(LABELS, LABELS, p50=10.0),
        # Separately measured p50s say 10/6.0 = 1.67x; timed alternately with the baseline, 1.9x.
        ("student", "cpu"): measurement(LABELS, LABELS, p50=6.0, paired_speedup={"reference": "baseline", "speedup": 1.9}),
        ("pruned", "cpu"): measurement(LABELS, LABELS, p50=3.0, paired_speedup={"reference": "baseline", "speedup": 3.8}),
        ("lone", "cpu"): measurement(LABELS, LABELS, p50=4.0),  # no paired rounds: separate p50s
    }
    rows = {r.id: r.dump() for r in build_rows(meta, typed(res), LABELS, recipe)}
    assert rows["student"]["speedup_vs_baseline"] == pytest.approx(1.9) and rows["student"]["paired_vs_baseline"]
    assert rows["student"]["speedup_vs_input"] == pytest.approx(1.9) and rows["student"]["paired_vs_input"]
    assert rows["pruned"]["speedup_vs_input"] == pytest.approx(2.0)  # (10/pruned) / (10/student)
    assert rows["lone"]["speedup_vs_baseline"] == pytest.approx(2.5) and "paired_vs_baseline" not in rows["lone"]
    # A pairing with some other reference (the budget's baseline changed) is not used.
    res[("student", "cpu")]["paired_speedup"]["reference"] = "other"
    rows = {r.id: r.dump() for r in build_rows(meta, typed(res), LABELS, recipe)}
    assert rows["student"]["speedup_vs_baseline"] == pytest.approx(10 / 6)
    assert rows["pruned"]["speedup_vs_input"] == pytest.approx(2.0) and "paired_vs_input" not in rows["pruned"]


def test_a_selection_no_better_than_the_baseline_says_so():
    # Within the accuracy budget, but slower and dearer than the baseline (as 4-bit on a
    # CPU): still the selected compressed variant, and the decision notes the baseline.
    res = {
        "baseline": measurement(LABELS, LABELS, p50=10, p95=12, throughput=100),
        "slow": measurement(LABELS, LABELS, p50=15, p95=18, throughput=70),
    }
    d, rows = run_decide(res)
    assert d["selected"] == "slow" and d["exit_code"] == EXIT_OK
    assert any("the baseline is no worse on min_cost" in n for n in d["notes"])
    d, _ = run_decide(three_variants())
    assert not any("baseline is no worse" in n for n in d["notes"])


# ------------------------------------------------------------------ ties within timing noise


def close_variants(cheap_throughput: float = 400.0):
    # 'cheap' is cheaper by a margin that timings do not repeat; 'accurate' is 0.5 points
    # more accurate (1 of 400 wrong against 3), a gap 400 sentences cannot tell from chance,
    # and larger; 'far' is clearly dearer. All are within the 1-point budget.
    return {
        "baseline": measurement(LABELS, LABELS, p50=10, p95=12, throughput=100),
        "cheap": measurement(flip(LABELS, 3, seed=3), LABELS, p50=4, p95=5, throughput=cheap_throughput, size_mb=50),
        "accurate": measurement(flip(LABELS, 1, seed=4), LABELS, p50=5, p95=6, throughput=360, size_mb=200),
        "far": measurement(flip(LABELS, 2, seed=5), LABELS, p50=9, p95=11, throughput=150, size_mb=20),
    }


def test_a_tie_goes_to_the_smaller_variant_when_quality_cannot_tell_them_apart():
    d, rows = run_decide(close_variants())  # 'cheap' costs 0.9x 'accurate': within the default 25%
    assert d["selected"] == "cheap" and d["tied"] == ["cheap", "accurate"] and d["tie_tolerance"] == 0.25
    assert any("'cheap', 'accurate' are within 25% of the best $/1K" in n and "beyond chance" in n
               and "the smallest, 'cheap', is deployed" in n for n in d["notes"])
    reason = rows["accurate"]["reasons"][0]
    assert reason.startswith("within budget at $") and "but 'cheap' is smaller (50.0 MB vs 200.0 MB), and the " \
        "accuracy difference is within chance (99.25% vs 99.75%, -0.50 points [" in reason
    assert rows["far"]["reasons"][0].startswith("within budget, but $")  # not tied: the plain reason


def test_a_tied_variant_more_accurate_beyond_chance_wins_the_tie():
    res = close_variants()
    res["cheap"] = measurement(flip(LABELS, 16, seed=3), LABELS, p50=4, p95=5, throughput=400, size_mb=50)  # -4 points
    d, rows = run_decide(res, max_accuracy_drop=5.0)
    assert d["selected"] == "accurate" and d["tied"] == ["cheap", "accurate"]
    assert rows["cheap"]["reasons"][0].startswith(
        "within budget and the best $/1K ($0.00004/1K), but 'accurate' is within 25% of it and more accurate "
        "beyond chance (99.75% vs 96.00%, +3.75 points [")


def test_the_tie_break_holds_when_a_small_accuracy_gap_reverses_on_other_data():
    # The same two variants scored on two eval sets drawn alike: the point estimates swap
    # order (a sentence or two either way), the paired intervals cover zero on both, and
    # the pick stays with the smaller one. Ordering by the point estimate flips it.
    picks = set()
    for wrong_small, wrong_large in ((4, 1), (2, 3)):
        res = {
            "baseline": measurement(LABELS, LABELS, p50=10, p95=12, throughput=100),
            "single": measurement(flip(LABELS, wrong_small, seed=7), LABELS, throughput=400, size_mb=23),
            "cascade": measurement(flip(LABELS, wrong_large, seed=8), LABELS, throughput=420, size_mb=32),
        }
        picks.add(run_decide(res)[0]["selected"])
        rows = build_rows(variants(*res), typed({(k, "cpu"): v for k, v in res.items()}), LABELS, recipe_dict())
        for r in rows:
            r._scores = None  # no per-example scores: the point estimates order the tie
        picks_by_point = decide(rows, recipe_dict(), ["cpu"]).selected
        assert picks_by_point == ("cascade" if wrong_large < wrong_small else "single")
    assert picks == {"single"}


def test_the_pick_repeats_when_the_timings_of_tied_variants_swap_order():
    # The point of the tolerance: timings that move by 10-20% between runs leave the pick alone.
    picks = {run_decide(close_variants(cheap_throughput=t))[0]["selected"] for t in (300.0, 360.0, 400.0, 440.0)}
    assert picks == {"cheap"}
    # Without it, the same runs flip between the two.
    picks = {run_decide(close_variants(cheap_throughput=t), tie_tolerance=0.0)[0]["selected"]
             for t in (300.0, 440.0)}
    assert picks == {"cheap", "accurate"}


def test_a_clear_cost_gap_still_wins_and_zero_tolerance_is_strict():
    d, _ = run_decide(close_variants(cheap_throughput=250.0))  # 'accurate' 0.69x 'cheap': a real difference
    assert d["selected"] == "accurate" and d["tied"] == ["accurate"]
    assert not any("within 25%" in n for n in d["notes"])
    d, rows = run_decide(close_variants(cheap_throughput=440.0), tie_tolerance=0.0)
    assert d["selected"] == "cheap"
    assert rows["accurate"]["reasons"][0].startswith("within budget, but $")


def test_a_tie_at_equal_accuracy_goes_to_the_smaller_variant():
    res = close_variants()
    res["accurate"] = measurement(flip(LABELS, 3, seed=3), LABELS, p50=5, p95=6, throughput=420, size_mb=200)
    d, rows = run_decide(res)  # 'accurate' is now the cheapest, equally accurate, and 4x larger
    assert d["selected"] == "cheap"
    assert "but 'cheap' is within 25% of it and smaller (50.0 MB vs 200.0 MB)" in rows["accurate"]["reasons"][0]


def test_min_size_takes_no_tolerance():
    res = close_variants()
    res["accurate"]["size_bytes"] = 21e6  # 1.05x the smallest ('far', 20 MB), and more accurate
    d, _ = run_decide(res, objective="min_size")
    assert d["selected"] == "far" and d["tied"] == ["far"] and d["tie_tolerance"] == 0.0


def test_every_tied_loser_says_what_decided_the_tie():
    res = close_variants()
    res["cheap"] = measurement(flip(LABELS, 16, seed=3), LABELS, p50=4, p95=5, throughput=400, size_mb=50)  # -4 points
    res["mid"] = measurement(flip(LABELS, 3, seed=6), LABELS, p50=4, p95=5, throughput=380, size_mb=60)
    d, rows = run_decide(res, max_accuracy_drop=5.0)
    # 'accurate' and 'mid' beat 'cheap' beyond chance and not each other: the smaller of them wins.
    assert d["selected"] == "mid" and d["tied"] == ["cheap", "mid", "accurate"]
    assert "but 'mid' is within 25% of it and more accurate beyond chance (99.25% vs 96.00%" in rows["cheap"]["reasons"][0]
    reason = rows["accurate"]["reasons"][0]
    assert reason.startswith("within budget at $") and "within 25% of the best ($" in reason
    assert "but 'mid' is smaller (60.0 MB vs 200.0 MB), and the accuracy difference is within chance" in reason


def test_too_few_eval_sentences_deploy_nothing_unless_the_minimum_is_lowered():
    """One eval sentence gives a 0-point delta with the interval [0, 0]: below
    budget.min_eval_examples (default 50) the decision says the evidence is too thin, exit 3."""
    import copy

    from compress.decision.decide import build_rows, decide
    from tests.synthetic_report import measurement, recipe_dict, variants

    labels = np.array([1])
    res = {("baseline", "cpu"): measurement(labels, labels), ("int8", "cpu"): measurement(labels, labels, size_mb=25)}
    recipe = recipe_dict()
    rows = build_rows(variants("baseline", "int8"), typed(copy.deepcopy(res)), labels, recipe)
    d = decide(rows, recipe, ["cpu"], eval_examples=1)
    assert d.selected is None and d.exit_code == 3 and d.too_few_eval_examples
    assert any("evidence is too thin" in n and "1 sentence," in n for n in d.notes)
    assert next(r for r in rows if r.id == "int8").verdict == "within budget"

    lowered = recipe_dict(min_eval_examples=0)
    rows = build_rows(variants("baseline", "int8"), typed(copy.deepcopy(res)), labels, lowered)
    d = decide(rows, lowered, ["cpu"], eval_examples=1)
    assert d.selected == "int8" and d.exit_code == 0


def test_the_default_minimum_eval_size_is_fifty():
    from compress.recipe.schema import BudgetSpec

    assert BudgetSpec().min_eval_examples == 50


def test_a_student_that_is_not_smaller_is_flagged_in_its_row_and_in_the_decision():
    # distill on ALBERT: shared layers, so the student is faster but has the teacher's weights.
    res = {"baseline": measurement(LABELS, LABELS, p50=10, throughput=100, size_mb=40),
           "student": measurement(LABELS, LABELS, p50=5, throughput=200, size_mb=40)}
    meta = variants("baseline", "student")
    meta[1]["not_smaller"] = "ALBERT shares one set of layer weights across its passes"
    rows = {r.id: r for r in build_rows(meta, typed({(k, "cpu"): v for k, v in res.items()}), LABELS, recipe_dict())}
    [note] = [n for n in rows["student"].notes if n.startswith("not smaller")]
    assert "'baseline'" in note and "ALBERT shares" in note
    assert not any(n.startswith("not smaller") for n in rows["baseline"].notes)
    decision = decide(list(rows.values()), recipe_dict(), ["cpu"])
    assert decision.selected == "student"
    assert any("'student' is deployed, but it is not smaller" in n for n in decision.notes)
    # Without the stage's word, no such note: the check above can fail.
    meta[1]["not_smaller"] = None
    rows = build_rows(meta, typed({(k, "cpu"): v for k, v in res.items()}), LABELS, recipe_dict())
    assert not any("not smaller" in n for n in decide(rows, recipe_dict(), ["cpu"]).notes)


# ------------------------------------------------------------------ runtimes side by side


def _runtime_variants():
    def v(vid, stage, fmt, source):
        return {"id": vid, "stage": stage, "format": fmt, "source": source, "fingerprint": "f" * 16}

    return [
        v("baseline", "finetune", "hf", None),
        v("onnx", "export_onnx", "onnx", "baseline"), v("onnx_int8", "quantize_onnx", "onnx", "onnx"),
        v("ov", "export_openvino", "openvino", "onnx"), v("ov_int8", "quantize_openvino", "openvino", "ov"),
        v("trimmed", "trim_vocab", "hf", "baseline"),
        v("small_onnx", "export_onnx", "onnx", "trimmed"), v("small_fused", "optimize_onnx", "onnx", "small_onnx"),
        v("small_int8", "quantize_onnx", "onnx", "small_fused"),
        v("small_ov", "export_openvino", "openvino", "trimmed"),  # from torch: still the same model
        v("small_ov_int8", "quantize_openvino", "openvino", "small_ov"),
    ]


def test_openvino_rows_are_compared_with_their_onnxruntime_siblings():
    meta = _runtime_variants()
    res = {(m["id"], "cpu"): measurement(LABELS, LABELS, p50=10.0) for m in meta}
    res[("onnx_int8", "cpu")] = measurement(flip(LABELS, 8), LABELS, p50=5.0, throughput=400.0,
                                            paired_speedup={"reference": "baseline", "speedup": 2.0, "rounds": [2.0, 1.6]})
    res[("ov_int8", "cpu")] = measurement(flip(LABELS, 4), LABELS, p50=4.0, throughput=300.0,
                                          paired_speedup={"reference": "baseline", "speedup": 2.5, "rounds": [2.4, 2.4]})
    rows = {r.id: r.dump() for r in build_rows(meta, typed(res), LABELS, recipe_dict())}
    assert rows["ov"]["runtime"] == "openvino" and rows["onnx"]["runtime"] == "onnxruntime"
    assert rows["baseline"]["runtime"] == "torch"
    sib = lambda vid: [e["id"] for e in rows[vid].get("vs_runtime", [])]  # noqa: E731
    assert sib("ov") == ["onnx"] and sib("ov_int8") == ["onnx_int8"]
    assert sib("small_ov") == ["small_onnx", "small_fused"] and sib("small_ov_int8") == ["small_int8"]
    assert all(not sib(v) for v in ("onnx", "onnx_int8", "small_int8", "baseline", "trimmed"))

    e = rows["ov_int8"]["vs_runtime"][0]
    assert e["delta"] == pytest.approx(1.0)  # 4 errors against 8 in 400
    assert e["delta_ci95"][0] < 1.0 < e["delta_ci95"][1]
    # Paired rounds: the quotient of the two speed-ups against the baseline, and per round.
    assert e["paired"] and e["speedup_b1"] == pytest.approx(1.25)
    assert e["speedup_b1_rounds"] == pytest.approx([1.2, 1.5])
    assert e["throughput_ratio"]["32"] == pytest.approx(0.75)
    note = next(n for n in rows["ov_int8"]["notes"] if n.startswith("vs onnxruntime"))
    assert "'onnx_int8'" in note and "+1.00 points" in note and "1.25x as fast" in note
    assert "paired rounds 1.20x to 1.50x" in note and "batch 32 throughput 0.75x" in note
    # Without paired rounds on both sides: the separately measured p50s, said so.
    e = rows["ov"]["vs_runtime"][0]
    assert not e["paired"] and e["speedup_b1"] == pytest.approx(1.0)
    assert any("(separate p50s)" in n for n in rows["ov"]["notes"])


def test_the_table_names_the_runtime_of_every_row():
    from compress.reports.report_json import table_rows

    meta = _runtime_variants()[:5]
    from compress.reports.report_json import Report

    res = typed({(m["id"], "cpu"): measurement(LABELS, LABELS) for m in meta})
    report = Report.model_validate(make_report({}, LABELS))
    report.rows = build_rows(meta, res, LABELS, recipe_dict())
    decide(report.rows, recipe_dict(), ["cpu"])
    cells = {row[0]: row[1] for row in table_rows(report)}
    assert cells == {"baseline": "hf (torch)", "onnx": "onnx (onnxruntime)", "onnx_int8": "onnx (onnxruntime)",
                     "ov": "openvino", "ov_int8": "openvino"}


def test_one_quality_gate_for_the_budget_checks_and_compress_gate():
    """quality_check is the gate the decision's budget checks use and `compress gate` runs:
    the drop on the point estimate, or on the losing end of the interval with ci_lower."""
    from compress.decision.decide import quality_check
    from compress.core.task import Metric, get_task

    acc = get_task().metric
    row = Row(id="q", format="hf", device="cpu", ok=True, delta=-0.75, delta_ci95=(-1.6, 0.1))
    assert quality_check(row, 1.0, "point", acc).status == "pass"
    check = quality_check(row, 1.0, "ci_lower", acc)
    assert check.status == "fail" and check.message == (
        "lower 95% bound of the accuracy delta 1.60 points exceeds the budget of 1.00")
    assert quality_check(row, 1.6, "ci_lower", acc).status == "pass"  # the limit is inclusive
    assert quality_check(Row(id="q", format="hf", device="cpu", ok=True), 1.0, "point", acc).message == (
        "no accuracy delta: the baseline was not measured on cpu")
    # A metric where lower is better (perplexity): a positive delta is the drop.
    ppl = Metric(name="perplexity", direction="lower", delta_unit="")
    worse = Row(id="q", format="hf", device="cpu", ok=True, delta=0.5, delta_ci95=(0.2, 1.4))
    assert quality_check(worse, 1.0, "point", ppl).status == "pass"
    assert quality_check(worse, 1.0, "ci_lower", ppl).message.startswith("upper 95% bound of the perplexity delta 1.40")
    budget = recipe_dict(max_accuracy_drop=1.0, gate_on="ci_lower").budget
    assert budget_checks(row, budget)[0] == check


# ------------------------------------------------------------------ stability


def _rows(res: dict, **budget):
    policy = recipe_dict(**budget)
    rows = build_rows(variants(*res), typed({(k, "cpu"): v for k, v in res.items()}), LABELS, policy)
    return rows, policy


def _replay(rows, policy, resamples: int):
    """decision.stability as the run calls it: after the decision on the real split (on copies here)."""
    from compress.decision.decide import stability

    selected = decide([r.model_copy(deep=True) for r in rows], policy, ["cpu"]).selected
    return stability(rows, policy, ["cpu"], selected, len(LABELS), resamples=resamples)


def test_a_pick_that_no_resample_changes_is_one_outcome():
    rows, policy = _rows(three_variants())  # every variant answers like the baseline: intervals [0, 0]
    shares = _replay(rows, policy, 30)
    assert [(s.selected, s.share) for s in shares] == [("cheap", 1.0)]


def test_a_variant_at_the_edge_of_the_budget_splits_the_replayed_decisions():
    from compress.decision.decide import stability_note

    # 4 of 400 wrong: -1.00 point against a perfect baseline, exactly at the 1-point budget
    # on the point estimate, so about half the resamples put it over.
    res = {"baseline": measurement(LABELS, LABELS, throughput=100),
           "edge": measurement(flip(LABELS, 4, seed=11), LABELS, throughput=400)}
    rows, policy = _rows(res, gate_on="point")
    actual = decide([r.model_copy(deep=True) for r in rows], policy, ["cpu"]).selected
    assert actual == "edge"
    shares = _replay(rows, policy, 100)
    outcomes = {s.selected: s.share for s in shares}
    assert set(outcomes) == {"edge", None}
    assert 0.2 < outcomes["edge"] < 0.8 and sum(outcomes.values()) == pytest.approx(1.0)
    assert shares[0].share >= shares[1].share
    note = stability_note(shares, actual, 100, len(LABELS))
    assert note.startswith("stability: replayed on 100 resamples of the 400 eval examples")
    assert "'edge' in" in note and "no variant in" in note and "'edge' is not settled by this eval split" in note
    # The interval gate rejects 'edge' on the real split and on most resamples (only those
    # that draw one or two of its 4 errors put the interval's lower end within the budget).
    rows, policy = _rows(res, gate_on="ci_lower")
    shares = _replay(rows, policy, 50)
    assert shares[0].selected is None and shares[0].share > 0.7


def test_replaying_the_decision_leaves_the_rows_and_the_real_decision_alone():
    rows, policy = _rows(close_variants())
    before = [r.model_dump() for r in rows]
    first = _replay(rows, policy, 40)
    assert [r.model_dump() for r in rows] == before
    assert _replay(rows, policy, 40) == first  # seeded
    d = decide(rows, policy, ["cpu"])
    assert d.selected == "cheap" and first[0].selected == "cheap"


def test_no_stability_without_per_example_scores():
    rows, policy = _rows(three_variants())
    rows[1]._scores = None
    assert _replay(rows, policy, 10) is None


# ------------------------------------------------------------------ eval split size for the interval gate


def _pair_wrong_on(baseline_wrong: range, variant_wrong: range, labels: np.ndarray, copies: int = 1) -> dict:
    """Baseline and variant measurements wrong on the given indices of `labels`, each tiled
    `copies` times (a larger eval split with the same per-example differences)."""
    def preds(wrong):
        p = labels.copy()
        p[list(wrong)] = 1 - p[list(wrong)]
        return np.tile(p, copies)

    big = np.tile(labels, copies)
    return {"baseline": measurement(preds(baseline_wrong), big, throughput=100),
            "q": measurement(preds(variant_wrong), big, throughput=400)}, big


def _decide_on(res: dict, labels: np.ndarray, **budget):
    policy = recipe_dict(**budget)
    rows = build_rows(variants(*res), typed({(k, "cpu"): v for k, v in res.items()}), labels, policy)
    return decide(rows, policy, ["cpu"]), {r.id: r for r in rows}


def test_the_interval_gate_says_how_many_eval_examples_would_pass_a_variant_within_budget_on_its_point():
    # Baseline wrong on 40 of 400, the variant on 42 (20 of them shared): -0.50 points, and
    # they disagree on 42 examples, 10.5%, so the interval is about +-3 points wide.
    res, labels = _pair_wrong_on(range(0, 40), range(20, 62), LABELS)
    d, rows = _decide_on(res, labels, gate_on="ci_lower")
    q = rows["q"]
    assert d.selected is None and q.delta == pytest.approx(-0.5)
    n = q.examples_to_pass
    # (1.96 * sd * 100 / (1.0 - 0.5))^2, sd of the differences sqrt((0.105 - 0.005^2) * 400/399)
    assert n == pytest.approx((1.96 * np.sqrt((0.105 - 0.005**2) * 400 / 399) * 100 / 0.5) ** 2, rel=1e-3)
    assert f"(the point, -0.50, is within it: an eval split of about {n:,} examples, against 400 here," in q.reasons[0]
    assert q.reasons[0] == next(c.message for c in q.checks if c.status == "fail")
    assert q.dump()["examples_to_pass"] == n
    # The figure is the bootstrap's: the same differences on 1.6x that many examples pass the
    # gate, on 0.6x they do not (nearer 1x, the bootstrap's own percentile noise, a few
    # hundredths of a point, decides).
    for factor, passes in ((1.6, True), (0.6, False)):
        copies = round(factor * n / len(LABELS))
        res, labels = _pair_wrong_on(range(0, 40), range(20, 62), LABELS, copies)
        d, rows = _decide_on(res, labels, gate_on="ci_lower")
        assert (d.selected == "q") is passes, (factor, rows["q"].delta_ci95)
        assert rows["q"].examples_to_pass is None if passes else rows["q"].examples_to_pass == pytest.approx(n, rel=0.01)


def test_no_eval_split_size_is_named_where_it_cannot_help():
    # -1.50 points on the point estimate: over the 1-point budget whatever the split's size.
    res, labels = _pair_wrong_on(range(0, 40), range(20, 66), LABELS)
    d, rows = _decide_on(res, labels, gate_on="ci_lower")
    assert rows["q"].examples_to_pass is None and "eval split of about" not in rows["q"].reasons[0]
    # Gating on the point: a within-budget variant passes, a rejected one is over on its point.
    res, labels = _pair_wrong_on(range(0, 40), range(20, 62), LABELS)
    d, rows = _decide_on(res, labels, gate_on="point")
    assert d.selected == "q" and rows["q"].examples_to_pass is None
    assert "examples_to_pass" not in rows["baseline"].dump() and "examples_to_pass" not in rows["q"].dump()
