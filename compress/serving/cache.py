"""The result cache in front of the model: a text answered once is answered again from here.

The key is sha256 over the variant's fingerprint and the text normalised (NFC, stripped,
runs of whitespace as one space; case kept, since a cased model reads case), so two
variants never share answers and a rebuilt variant starts empty. Kinds: `memory` (a bounded
LRU with a TTL in each HTTP front replica), `redis` (one server every replica shares), `none`.

A cache never fails a request: a Redis call that errs or outlasts `timeout_s` counts as a
miss, the cache is off for `retry_s` (one log line when it goes down, one when it is back)
and the request goes on to the model.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
import unicodedata
from collections import OrderedDict
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from compress.recipe.serving import CacheSpec

log = logging.getLogger("compress.serving.cache")
_SPACE = re.compile(r"\s+")


class Prediction(BaseModel):
    """One text's answer, as a transformers text-classification pipeline gives it."""

    model_config = ConfigDict(extra="forbid")

    label: str
    score: float


def normalise(text: str) -> str:
    return _SPACE.sub(" ", unicodedata.normalize("NFC", text).strip())


def cache_key(text: str, fingerprint: str) -> str:
    digest = hashlib.sha256(f"{fingerprint}\0{normalise(text)}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"compress:v1:{digest}"


class Cache:
    """No cache: every text is a miss."""

    kind = "none"
    up: bool | None = None  # whether the last call worked; None without a cache
    errors = 0  # calls that failed

    async def get_many(self, keys: list[str]) -> list[Prediction | None]:
        return [None] * len(keys)

    async def put_many(self, items: list[tuple[str, Prediction]]) -> None:
        return None

    async def close(self) -> None:
        return None


class MemoryCache(Cache):
    """A bounded LRU with a TTL, in this process."""

    kind = "memory"
    up = True

    def __init__(self, max_entries: int, ttl_s: float):
        self.max_entries, self.ttl_s = max_entries, ttl_s
        self._items: OrderedDict[str, tuple[float, Prediction]] = OrderedDict()  # key -> (expiry, answer)

    async def get_many(self, keys: list[str]) -> list[Prediction | None]:
        now, out = time.monotonic(), []
        for k in keys:
            hit = self._items.get(k)
            if hit is not None and hit[0] <= now:
                del self._items[k]
                hit = None
            if hit is not None:
                self._items.move_to_end(k)
            out.append(hit[1] if hit else None)
        return out

    async def put_many(self, items: list[tuple[str, Prediction]]) -> None:
        expiry = time.monotonic() + self.ttl_s
        for k, p in items:
            self._items[k] = (expiry, p)
            self._items.move_to_end(k)
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)


def _where(url: str) -> str:
    """host:port/db of a Redis URL, without the password it may carry."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}{parts.path}" if parts.hostname else parts.path or url[:40]


class RedisCache(Cache):
    """A Redis server shared by every replica (answers as JSON, expiring after the TTL)."""

    kind = "redis"

    def __init__(self, url: str, ttl_s: float, timeout_s: float, retry_s: float):
        import redis.asyncio

        self.url, self.ttl_ms, self.timeout_s, self.retry_s = url, max(1, int(ttl_s * 1000)), timeout_s, retry_s
        self.client = redis.asyncio.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.up = True
        self.errors = 0
        self._off_until = 0.0  # monotonic time before which the cache is skipped

    def _usable(self) -> bool:
        return self.up or time.monotonic() >= self._off_until

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        if self.up:
            log.warning("result cache: Redis at %s failed (%s); serving without the cache, retrying every %gs",
                        _where(self.url), type(exc).__name__, self.retry_s)
        self.up = False
        self._off_until = time.monotonic() + self.retry_s

    def _worked(self) -> None:
        if not self.up:
            log.warning("result cache: Redis at %s answers again; the cache is back", _where(self.url))
        self.up = True

    async def get_many(self, keys: list[str]) -> list[Prediction | None]:
        if not keys or not self._usable():
            return [None] * len(keys)
        try:
            raw = await asyncio.wait_for(self.client.mget(keys), self.timeout_s * 2)
        except Exception as exc:  # any failure of the cache is a miss, never a failed request
            self._failed(exc)
            return [None] * len(keys)
        self._worked()
        out: list[Prediction | None] = []
        for value in raw:
            try:
                out.append(Prediction.model_validate_json(value) if value is not None else None)
            except ValueError:  # not ours, or damaged: a miss, rewritten after the model answers
                out.append(None)
        return out

    async def put_many(self, items: list[tuple[str, Prediction]]) -> None:
        if not items or not self._usable():
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for k, p in items:
                pipe.set(k, p.model_dump_json(), px=self.ttl_ms)
            await asyncio.wait_for(pipe.execute(), self.timeout_s * 2)
        except Exception as exc:
            self._failed(exc)
            return
        self._worked()

    async def close(self) -> None:
        try:
            await self.client.aclose()
        except Exception:  # closing a dead connection: nothing to keep
            pass


def make_cache(spec: CacheSpec) -> Cache:
    if spec.kind == "memory":
        return MemoryCache(spec.max_entries, spec.ttl_s)
    if spec.kind == "redis":
        return RedisCache(spec.url or "", spec.ttl_s, spec.timeout_s, spec.retry_s)
    return Cache()
