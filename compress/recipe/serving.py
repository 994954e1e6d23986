"""The recipe's `serving:` block: how a variant is served (batching, replicas, threads, the
result cache, request limits), the load it is measured under, the traffic it is sized for
and the prices that turn instances into $/month. Pydantic only: validated with the recipe,
before any model loads."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# --- the server (owned by the serve work) ---------------------------------------------


class ServerSpec(_Strict):
    pass


class CacheSpec(_Strict):
    pass


class LimitSpec(_Strict):
    pass


# --- the load, the traffic and the prices (owned by the load work) ---------------------


class LoadSpec(_Strict):
    pass


class TrafficSpec(_Strict):
    pass


class PricingSpec(_Strict):
    pass


class ServingSpec(_Strict):
    server: ServerSpec = Field(default_factory=ServerSpec)
    cache: CacheSpec = Field(default_factory=CacheSpec)
    limits: LimitSpec = Field(default_factory=LimitSpec)
    load: LoadSpec = Field(default_factory=LoadSpec)
    traffic: TrafficSpec = Field(default_factory=TrafficSpec)
    pricing: PricingSpec = Field(default_factory=PricingSpec)
