"""The recipe's serving.load, serving.traffic and serving.pricing settings, and the
min_monthly_cost objective that needs them: validated with the recipe, errors naming their key."""

from pathlib import Path

import pytest

from compress.core.errors import RecipeError
from compress.recipe.schema import load_recipe, validate_recipe

ROOT = Path(__file__).resolve().parents[2]


def error_of(recipe) -> RecipeError:
    with pytest.raises(RecipeError) as exc:
        validate_recipe(recipe, "r.yaml")
    assert len(str(exc.value).splitlines()) == 1
    return exc.value


def test_min_monthly_cost_needs_a_serving_block(base):
    base["budget"]["objective"] = "min_monthly_cost"
    e = error_of(base)
    assert e.key == "budget.objective" and "serving" in e.message
    base["serving"] = {}
    assert validate_recipe(base).budget.objective == "min_monthly_cost"


def test_the_defaults_describe_a_load_a_traffic_and_priced_instances(base):
    base["serving"] = {}
    s = validate_recipe(base).serving
    assert s.load.percentile == 0.99 and s.load.configurations[0] == "reference"
    assert s.traffic.zipf.pool > 0 and s.traffic.log is None
    assert s.traffic.offpeak_qps < s.traffic.peak_qps
    assert all(p.source for p in (s.pricing.on_demand, s.pricing.reserved, s.pricing.spot))


@pytest.mark.parametrize("serving, key", [
    ({"load": {"slo": 100}}, "serving.load.slo"),
    ({"load": {"percentile": 1.0}}, "serving.load.percentile"),
    ({"load": {"configurations": []}}, "serving.load.configurations"),
    ({"load": {"configurations": ["batched", "batched"]}}, "serving.load.configurations"),
    ({"load": {"configurations": ["fast"]}}, "serving.load.configurations"),
    ({"traffic": {"peak_qps": 10, "mean_qps": 20}}, "serving.traffic"),
    ({"traffic": {"log": "r.jsonl", "zipf": {"pool": 3}}}, "serving.traffic"),
    ({"traffic": {"zipf": {"exponent": -1}}}, "serving.traffic.zipf.exponent"),
    ({"pricing": {"spot": {"discount": 0.5}}}, "serving.pricing.spot.source"),
    ({"pricing": {"on_demand": {"usd_per_hour": -1, "source": "x"}}}, "serving.pricing.on_demand.usd_per_hour"),
])
def test_a_bad_setting_names_its_key(base, serving, key):
    base["serving"] = serving
    assert error_of(base).key.startswith(key)


def test_the_main_jobs_serving_block_is_valid_and_coarse():
    r = load_recipe(ROOT / "recipes" / "bert_sentiment.yaml")
    load = r.serving.load
    assert load.max_runs <= 3 and load.min_duration_s <= 3  # a few minutes at most on a 2-core machine
    assert r.budget.objective == "min_cost"  # the main job's decision is not changed by the load
    assert r.serving.traffic.offpeak_qps > 0
