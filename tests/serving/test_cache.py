"""compress.serving.cache: the key, the in-process LRU+TTL, and a real Redis that goes down."""

import asyncio
import logging
import time

import pytest

from compress.recipe.serving import CacheSpec
from compress.serving.cache import MemoryCache, Prediction, RedisCache, cache_key, make_cache, normalise
from tests.serving.served_run import RedisServer, redis_available


def run(coro):
    return asyncio.run(coro)


def test_the_key_normalises_space_and_unicode_but_keeps_case_and_the_variant():
    assert normalise("  a\u00a0 gripping\n\tfilm ") == "a gripping film"
    assert normalise("cafe\u0301") == "caf\u00e9"  # NFD -> NFC
    k = cache_key("a  gripping film", "fp1")
    assert k == cache_key(" a gripping\nfilm ", "fp1") == cache_key("a gripping film", "fp1")
    assert k != cache_key("A gripping film", "fp1")  # case kept: a cased model reads it
    assert k != cache_key("a gripping film", "fp2")  # another variant, other answers


def test_memory_cache_is_bounded_lru_with_ttl():
    c = MemoryCache(max_entries=2, ttl_s=0.2)
    p = [Prediction(label=str(i), score=i / 10) for i in range(3)]
    run(c.put_many([("a", p[0]), ("b", p[1])]))
    assert run(c.get_many(["a"])) == [p[0]]  # a is now the most recently used
    run(c.put_many([("c", p[2])]))  # evicts b, the least recently used
    assert run(c.get_many(["a", "b", "c"])) == [p[0], None, p[2]]
    time.sleep(0.25)
    assert run(c.get_many(["a", "c"])) == [None, None]


@pytest.fixture
def redis_server(tmp_path):
    why = redis_available()
    if why:
        pytest.skip(why)
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def test_redis_cache_round_trips_and_degrades_when_redis_goes_down(redis_server, caplog):
    spec = CacheSpec(kind="redis", url=redis_server.url, ttl_s=60, timeout_s=0.2, retry_s=0.3)
    p = Prediction(label="positive", score=0.9876543210123)

    async def scenario():
        c = make_cache(spec)
        assert isinstance(c, RedisCache)
        await c.put_many([("k1", p)])
        assert await c.get_many(["k1", "k2"]) == [p, None]  # the score survives exactly
        redis_server.stop()
        with caplog.at_level(logging.WARNING, logger="compress.serving.cache"):
            for _ in range(3):  # down: misses, never an exception; one log line
                assert await c.get_many(["k1"]) == [None]
                await c.put_many([("k3", p)])
        assert c.up is False and c.errors >= 1
        assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1
        redis_server.start()  # same port, empty: back after retry_s
        await asyncio.sleep(0.35)
        await c.put_many([("k4", p)])
        assert c.up is True and await c.get_many(["k4"]) == [p]
        await c.close()

    run(scenario())


def test_a_redis_url_nobody_listens_on_is_a_miss_not_an_error():
    from tests.serving.served_run import free_port

    if redis_available():
        pytest.skip(redis_available())
    c = make_cache(CacheSpec(kind="redis", url=f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.1))
    assert run(c.get_many(["x"])) == [None] and c.up is False
