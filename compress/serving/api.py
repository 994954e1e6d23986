"""The HTTP API's request checks, done in the HTTP front before anything reaches the model.

    POST /predict  {"texts": ["...", ...]}  ->  {"predictions": [{"label": "positive", "score": 0.98}, ...]}
    GET  /healthz                           ->  {"status": "ok", "variant": ..., "cache": ...}
    GET  /metrics                           ->  Prometheus text

A request that breaks a rule gets a 4xx and one line of JSON, {"error": "..."}.
"""

from __future__ import annotations

import json

from compress.recipe.serving import LimitSpec

ROUTES = {"/predict": ("POST",), "/healthz": ("GET", "HEAD"), "/metrics": ("GET", "HEAD")}


class BadRequest(Exception):
    """A request the server refuses: its HTTP status and the one-line reason."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def route(method: str, path: str) -> str:
    """The route a request names, or BadRequest 404 / 405."""
    path = path.rstrip("/") or "/"
    methods = ROUTES.get(path)
    if methods is None:
        raise BadRequest(404, f"no route {path[:200]}; use POST /predict, GET /healthz or GET /metrics")
    if method not in methods:
        raise BadRequest(405, f"{path} takes {' or '.join(methods)}, not {method[:20]}", {"Allow": ", ".join(methods)})
    return path


def check_length(content_length: str | None, limits: LimitSpec) -> None:
    """Refuses a body whose declared length is over the limit before it is read."""
    if content_length is None:
        return
    try:
        n = int(content_length)
    except ValueError:
        raise BadRequest(400, "Content-Length is not a number") from None
    if n > limits.max_body_bytes:
        raise BadRequest(413, f"body of {n} bytes is over the limit of {limits.max_body_bytes}")


def parse_predict(body: bytes, limits: LimitSpec) -> list[str]:
    """The texts of a /predict body, or BadRequest naming what is wrong with it."""
    if len(body) > limits.max_body_bytes:
        raise BadRequest(413, f"body of {len(body)} bytes is over the limit of {limits.max_body_bytes}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(400, f"body is not UTF-8 (byte {exc.start}); send JSON in UTF-8") from None
    if not text.strip():
        raise BadRequest(400, 'empty body; send {"texts": ["..."]}')
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(400, f"body is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise BadRequest(400, "body is nested too deeply to be a request") from None
    if not isinstance(obj, dict):
        raise BadRequest(422, 'body must be a JSON object: {"texts": ["..."]}')
    extra = sorted(k for k in obj if k != "texts")
    if extra:
        raise BadRequest(422, f"unknown key '{str(extra[0])[:50]}'; the body takes only texts")
    if "texts" not in obj:
        raise BadRequest(422, 'missing key texts: send {"texts": ["..."]}')
    texts = obj["texts"]
    if not isinstance(texts, list):
        raise BadRequest(422, f"texts must be a list of strings, not {_kind(texts)}")
    if not texts:
        raise BadRequest(422, "texts is empty; send one text or more")
    if len(texts) > limits.max_texts:
        raise BadRequest(413, f"{len(texts)} texts is over the limit of {limits.max_texts} per request; split it")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise BadRequest(422, f"texts[{i}] must be a string, not {_kind(t)}")
        if len(t) > limits.max_text_chars:
            raise BadRequest(413, f"texts[{i}] has {len(t)} characters, over the limit of {limits.max_text_chars}")
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:  # a JSON escape of half a surrogate pair ("\ud800")
            raise BadRequest(422, f"texts[{i}] holds a lone surrogate (\\ud800-\\udfff), which is not text") from None
    return texts


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def error_body(message: str) -> bytes:
    """{"error": message} on one line (the message's own newlines escaped by JSON)."""
    return json.dumps({"error": message}).encode()
