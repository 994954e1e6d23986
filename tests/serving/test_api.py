"""compress.serving.api: every bad request is a 4xx with a one-line reason, before the model."""

import json

import pytest

from compress.recipe.serving import LimitSpec
from compress.serving.api import BadRequest, check_length, error_body, parse_predict, route

LIMITS = LimitSpec(max_body_bytes=1000, max_texts=4, max_text_chars=50)


def status(body: bytes) -> int:
    with pytest.raises(BadRequest) as exc:
        parse_predict(body, LIMITS)
    assert "\n" not in exc.value.message
    return exc.value.status


def test_valid_bodies_give_their_texts():
    assert parse_predict(b'{"texts": ["a", "", "caf\\u00e9"]}', LIMITS) == ["a", "", "caf\u00e9"]
    assert parse_predict('{"texts": ["ünïcode"]}'.encode(), LIMITS) == ["ünïcode"]


@pytest.mark.parametrize("body, code", [
    (b"{not json", 400), (b"", 400), (b"\xff\xfe{}", 400),
    (b'["a"]', 422), (b"{}", 422), (b'{"text": ["a"]}', 422), (b'{"texts": "a"}', 422), (b'{"texts": []}', 422),
    (b'{"texts": ["a", 3]}', 422), (b'{"texts": [null]}', 422), (b'{"texts": [["a"]]}', 422),
    (b'{"texts": ["\\ud800"]}', 422), (b'{"texts": ["a"], "extra": 1}', 422),
    (json.dumps({"texts": ["a"] * 5}).encode(), 413), (json.dumps({"texts": ["a" * 51]}).encode(), 413),
    (json.dumps({"texts": ["a" * 40] * 30}).encode(), 413),
])
def test_bad_bodies_get_their_4xx(body, code):
    assert status(body) == code


def test_json_nested_past_the_parser_is_a_400():
    with pytest.raises(BadRequest) as exc:
        parse_predict(b"[" * 100_000 + b"]" * 100_000, LimitSpec())
    assert exc.value.status == 400


def test_routes_methods_and_declared_length():
    assert route("POST", "/predict") == "/predict" and route("GET", "/healthz/") == "/healthz"
    for method, path, code in (("GET", "/predict", 405), ("POST", "/metrics", 405), ("GET", "/nope", 404)):
        with pytest.raises(BadRequest) as exc:
            route(method, path)
        assert exc.value.status == code
    with pytest.raises(BadRequest) as exc:
        route("GET", "/predict")
    assert exc.value.headers == {"Allow": "POST"}
    check_length("999", LIMITS)
    for value, code in (("1001", 413), ("x", 400)):
        with pytest.raises(BadRequest) as exc:
            check_length(value, LIMITS)
        assert exc.value.status == code
    assert json.loads(error_body("a\nb")) == {"error": "a\nb"} and b"\n" not in error_body("a\nb")
