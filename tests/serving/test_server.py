"""compress.serving.server on a real Ray Serve (one local Ray for the module): real HTTP
requests against tiny random BERT variants; a flood of bad requests amid valid traffic; the
cache's answers; two ServingSpecs served one after the other; a cascade with a Redis cache
that goes down."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("ray.serve", reason="needs the serve extra: pip install -e \".[serve]\"")
requests = pytest.importorskip("requests")

from compress.core.errors import CompressError  # noqa: E402
from compress.data.artifacts import ArtifactStore  # noqa: E402
from compress.recipe.serving import ServingSpec  # noqa: E402
from compress.serving.server import ray_session, start  # noqa: E402
from tests.serving.served_run import TEXTS, RedisServer, build_run, redis_available  # noqa: E402

LIMITS = {"max_texts": 16, "max_text_chars": 500, "max_body_bytes": 20_000}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer_dir):
    return build_run(tmp_path_factory.mktemp("served"), tokenizer_dir)


@pytest.fixture(scope="module")
def ray_up():
    with ray_session():
        yield


@pytest.fixture(scope="module")
def server(run_dir, ray_up):
    # Two model replicas behind one front (topology front_and_model: one memory cache), the
    # counts below sums over both (compress.serving.stats); the cascade below runs one_hop.
    spec = ServingSpec.model_validate({"server": {"max_batch_size": 8, "batch_wait_timeout_s": 0.05, "num_replicas": 2,
                                                  "topology": "front_and_model"},
                                       "limits": LIMITS})
    s = start(run_dir, spec)
    yield s
    s.stop()


def in_process(folder, texts):
    from compress.techniques.classify import load_classifier

    return [o[0] for o in load_classifier(folder, threads=1)(texts)]


def post(server, texts, timeout=60):
    return requests.post(f"{server.url}/predict", json={"texts": texts}, timeout=timeout)


def test_serves_the_selected_variant_as_a_pipeline_answers_and_the_cache_answers_the_same(server, run_dir):
    assert server.variant == "small" and server.url.startswith("http://127.0.0.1:")
    assert server.fingerprint == ArtifactStore(run_dir).load("small").identity
    health = requests.get(f"{server.url}/healthz", timeout=10)
    assert health.status_code == 200 and health.json()["variant"] == "small"

    before = server.snapshot()
    r = post(server, TEXTS)
    assert r.status_code == 200
    got = r.json()["predictions"]
    want = in_process(run_dir / "small", TEXTS)
    assert [g["label"] for g in got] == [w["label"] for w in want] and {g["label"] for g in got} <= {"negative", "positive"}
    assert [g["score"] for g in got] == pytest.approx([w["score"] for w in want], abs=1e-4)

    again = post(server, [f"  {t.replace(' ', '   ')} " for t in TEXTS])  # normalised to the same keys
    assert again.json() == r.json()
    after = server.snapshot()
    assert after.cache_hits - before.cache_hits == len(TEXTS)
    assert after.cache_misses - before.cache_misses == len(TEXTS)
    assert after.requests[200] - before.requests.get(200, 0) == 2 and after.replicas == 2


def test_concurrent_requests_share_batches(server):
    before = server.snapshot()
    texts = [f"the film number {i} was good" for i in range(24)]
    with ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(lambda t: post(server, [t]).status_code, texts))
    assert codes == [200] * len(texts)
    after = server.snapshot()
    new = {k: v - before.batch_sizes.get(k, 0) for k, v in after.batch_sizes.items()}
    assert sum(k * v for k, v in new.items()) == len(texts)  # every text ran once, on one replica or the other
    assert max(k for k, v in new.items() if v) > 1 and max(new) <= 8  # batched, never over max_batch_size

    with pytest.raises(CompressError, match="never fill"):
        server.set_batching(max_batch_size=65)  # over the replicas' max_ongoing_requests
    server.set_batching(max_batch_size=2)  # at runtime: the replicas apply it, none restarts
    try:
        before = server.snapshot()
        with ThreadPoolExecutor(12) as pool:
            codes = list(pool.map(lambda t: post(server, [t, t + " again", t + " and again"]).status_code, texts))
        assert codes == [200] * len(texts)
        after = server.snapshot()
        new = {k: v - before.batch_sizes.get(k, 0) for k, v in after.batch_sizes.items()}
        assert {k for k, v in new.items() if v} == {1, 2} or {k for k, v in new.items() if v} == {2}
        assert after.replicas == 2
    finally:
        server.set_batching(max_batch_size=8)


BAD = [  # (method, path, body, headers, status)
    ("POST", "/predict", b"{not json", {}, 400),
    ("POST", "/predict", b'{"texts": ["caf\xe9"]}', {}, 400),  # Latin-1, not UTF-8
    ("POST", "/predict", b"", {}, 400),
    ("POST", "/predict", b'{"text": ["a"]}', {}, 422),
    ("POST", "/predict", b'{"texts": ["a", 7]}', {}, 422),
    ("POST", "/predict", b'{"texts": []}', {}, 422),
    ("POST", "/predict", json.dumps({"texts": ["a" * 501]}).encode(), {}, 413),
    ("POST", "/predict", json.dumps({"texts": ["a"] * 17}).encode(), {}, 413),
    ("POST", "/predict", b'{"texts": ["a"]' + b" " * 25_000 + b"}", {}, 413),  # body over 20,000 bytes
    ("GET", "/predict", b"", {}, 405),
    ("DELETE", "/healthz", b"", {}, 405),
    ("GET", "/admin", b"", {}, 404),
]


def test_a_flood_of_bad_requests_gets_4xx_while_valid_traffic_is_answered(server):
    before = server.snapshot()

    def send(i: int):
        if i % 3 == 0:
            r = post(server, [f"valid text {i}", "fine"])
            ok = r.status_code == 200 and len(r.json()["predictions"]) == 2
            return 200, r.status_code, ok
        method, path, body, headers, status = BAD[i % len(BAD)]
        r = requests.request(method, f"{server.url}{path}", data=body, headers=headers, timeout=60)
        err = r.json().get("error", "") if r.headers.get("content-type", "").startswith("application/json") else ""
        return status, r.status_code, bool(err) and "\n" not in err

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, range(120)))
    wrong = [(want, got) for want, got, ok in results if want != got or not ok]
    assert not wrong, wrong[:5]
    assert requests.get(f"{server.url}/healthz", timeout=10).status_code == 200
    assert post(server, ["still serving"]).status_code == 200
    after = server.snapshot()
    sent: dict[int, int] = {}
    for want, _, _ in results:
        sent[want] = sent.get(want, 0) + 1
    sent[200] += 2  # /healthz and "still serving"
    assert {k: after.requests.get(k, 0) - before.requests.get(k, 0) for k in sent} == sent  # the metrics count each


def test_metrics_is_prometheus_text(server):
    post(server, ["for the metrics"])
    r = requests.get(f"{server.url}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    lines = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in r.text.splitlines() if not ln.startswith("#")}
    assert lines['compress_requests_total{variant="small",status="200"}'] >= 1
    assert lines['compress_request_latency_seconds_bucket{variant="small",le="+Inf"}'] >= 1
    assert lines['compress_batch_size_count{variant="small"}'] >= 1
    assert 'compress_cache_hits_total{variant="small",cache="memory"}' in lines
    assert lines['compress_replicas{variant="small"}'] == 2
    assert not any(k.startswith("compress_cascade_routed_share") for k in lines)  # not a cascade


def test_then_the_cascade_unbatched_behind_redis_which_goes_down(server, run_dir, tmp_path):
    why = redis_available()
    if why:
        pytest.skip(why)
    server.stop()  # one server after the other in this process, as the load measurement serves them
    redis = RedisServer(tmp_path).start()
    spec = ServingSpec.model_validate({"server": {"max_batch_size": 1, "autoscaling": {"min_replicas": 1, "max_replicas": 2}},
                                       "cache": {"kind": "redis", "url": redis.url, "timeout_s": 0.2, "retry_s": 0.5}})
    s = start(run_dir, spec, variant="cascade")
    try:
        assert s.variant == "cascade"
        r = post(s, TEXTS)
        assert r.status_code == 200
        want = in_process(run_dir / "cascade", TEXTS)
        assert [p["label"] for p in r.json()["predictions"]] == [w["label"] for w in want]
        stats = s.snapshot()
        assert set(stats.batch_sizes) == {1} and stats.cache == "redis" and stats.cache_up is True
        assert stats.routed_share is not None and 0.0 <= stats.routed_share <= 1.0
        assert 'compress_cascade_routed_share{variant="cascade"}' in requests.get(f"{s.url}/metrics", timeout=10).text

        assert post(s, TEXTS).json() == r.json() and s.snapshot().cache_hits == len(TEXTS)

        redis.stop()  # down: every request still answered, without the cache
        for i in range(3):
            assert post(s, [f"redis is down {i}"] + TEXTS[:2]).status_code == 200
        down = s.snapshot()
        assert down.cache_up is False and down.cache_errors >= 1
        assert "down" in requests.get(f"{s.url}/healthz", timeout=10).json()["cache"]

        redis.start()  # back (empty) once retry_s has passed
        time.sleep(0.6)
        assert post(s, ["redis is back"]).status_code == 200
        assert s.snapshot().cache_up is True
    finally:
        s.stop()
        redis.stop()
