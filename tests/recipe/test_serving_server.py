"""The recipe's serving.server, serving.cache and serving.limits settings: validated with the
recipe, every error naming its key."""

import pytest

from compress.core.errors import RecipeError
from compress.recipe.schema import validate_recipe
from compress.recipe.serving import ServingSpec


def error_of(recipe, serving) -> RecipeError:
    recipe["serving"] = serving
    with pytest.raises(RecipeError) as exc:
        validate_recipe(recipe, "r.yaml")
    return exc.value


def test_defaults_are_safe_for_a_small_machine(base):
    base["serving"] = {}
    s = validate_recipe(base).serving
    assert s.server.num_replicas == 1 and s.server.threads == 1 and s.server.max_batch_size >= 1
    assert s.server.host == "127.0.0.1" and s.cache.kind == "memory" and s.limits.max_texts >= 1
    assert ServingSpec().server == s.server


def test_a_redis_cache_without_url_names_serving_cache_url(base):
    e = error_of(base, {"cache": {"kind": "redis"}})
    assert "serving.cache.url" in str(e) and len(str(e).splitlines()) == 1
    base["serving"] = {"cache": {"kind": "redis", "url": "redis://127.0.0.1:6379/0"}}
    assert validate_recipe(base).serving.cache.url.startswith("redis://")
    assert "not a Redis URL" in str(error_of(base, {"cache": {"kind": "redis", "url": "http://x"}}))


@pytest.mark.parametrize("serving, key", [
    ({"server": {"max_batch_size": 0}}, "serving.server.max_batch_size"),
    ({"server": {"batch_wait_timeout_s": -1}}, "serving.server.batch_wait_timeout_s"),
    ({"server": {"batch_wait_timeout_s": float("inf")}}, "serving.server.batch_wait_timeout_s"),
    ({"server": {"threads": 1.5}}, "serving.server.threads"),
    ({"server": {"port": 70000}}, "serving.server.port"),
    ({"server": {"replicas": 2}}, "serving.server.replicas"),
    ({"server": {"autoscaling": {"max_replicas": 0}}}, "serving.server.autoscaling.max_replicas"),
    ({"cache": {"kind": "disk"}}, "serving.cache.kind"),
    ({"cache": {"ttl_s": float("nan")}}, "serving.cache.ttl_s"),
    ({"limits": {"max_texts": 0}}, "serving.limits.max_texts"),
    ({"limits": {"max_body": 10}}, "serving.limits.max_body"),
])
def test_bad_settings_name_their_key(base, serving, key):
    assert error_of(base, serving).key == key


def test_settings_that_contradict_each_other(base):
    e = error_of(base, {"server": {"num_replicas": 2, "autoscaling": {"max_replicas": 3}}})
    assert e.key == "serving.server" and "not both" in e.message
    assert "never fill" in error_of(base, {"server": {"max_batch_size": 32, "max_ongoing_requests": 16}}).message
    assert "above max_replicas" in error_of(base, {"server": {"autoscaling": {"min_replicas": 3, "max_replicas": 2}}}).message
