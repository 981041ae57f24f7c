"""``dsec placement serve``: the recommendation API (HTTP, JSON, an OpenAPI document) and
the kube-scheduler extender's verbs, over the history in the store.

Routes: ``POST /v1/recommend`` (a ``RecommendRequest``) and ``GET /v1/recommend?...``;
``POST /scheduler/filter`` and ``POST /scheduler/prioritize`` (kube-scheduler's
extender protocol); ``GET /openapi.json``; ``GET /healthz``. The history is read from the
store at most once per ``refresh_s``; a store that cannot be read answers 503 with why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError
from pydantic.json_schema import models_json_schema
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from dsec.placement.extender import filter_nodes, pod_request, prioritize_nodes
from dsec.placement.history import PlacementHistory, Query, read_history
from dsec.placement.ranking import PlacementConfig, recommend
from dsec.schemas import now_ms
from dsec.schemas.placement import Recommendation, RecommendRequest

__all__ = ["HistorySource", "make_app", "openapi_document", "store_history"]

log = logging.getLogger(__name__)


@dataclass
class HistorySource:
    """The history, read again once it is ``refresh_s`` old. ``load``: how it is read
    (``store_history(query)`` for the store)."""

    load: Callable[[], PlacementHistory]
    refresh_s: float = 5.0
    clock_s: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._history: PlacementHistory | None = None
        self._read_at_s = 0.0

    def get(self) -> PlacementHistory:
        with self._lock:
            now_s = self.clock_s()
            if self._history is None or now_s - self._read_at_s >= self.refresh_s:
                self._history = self.load()
                self._read_at_s = now_s
            return self._history


def store_history(query: Query) -> Callable[[], PlacementHistory]:
    return lambda: read_history(query)


def openapi_document() -> dict:
    _, schemas = models_json_schema(
        [(RecommendRequest, "validation"), (Recommendation, "serialization")],
        ref_template="#/components/schemas/{model}")
    ref = "#/components/schemas/{}".format
    query_params = [
        {"name": name, "in": "query", "required": name == "workload",
         "schema": {"type": kind}}
        for name, kind in (("workload", "string"), ("count", "integer"), ("pool", "string"),
                           ("regime", "string"), ("communicating", "boolean"))]
    answer = {"200": {"description": "ranked GPUs with reasons, and the filtered ones",
                      "content": {"application/json": {"schema": {"$ref": ref(
                          "Recommendation")}}}},
              "400": {"description": "a request that does not validate"},
              "503": {"description": "the history could not be read"}}
    extender = {"type": "object", "description": "k8s.io/kube-scheduler/extender/v1 "
                "ExtenderArgs: pod, and nodes (a v1.NodeList) or nodenames"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "dsec placement", "version": "1"},
        "paths": {
            "/v1/recommend": {
                "post": {"summary": "Where to place a workload",
                         "requestBody": {"required": True, "content": {"application/json": {
                             "schema": {"$ref": ref("RecommendRequest")}}}},
                         "responses": answer},
                "get": {"summary": "Where to place a workload", "parameters": query_params,
                        "responses": answer}},
            "/scheduler/filter": {"post": {
                "summary": "kube-scheduler extender filter verb",
                "requestBody": {"content": {"application/json": {"schema": extender}}},
                "responses": {"200": {"description": "ExtenderFilterResult"}}}},
            "/scheduler/prioritize": {"post": {
                "summary": "kube-scheduler extender prioritize verb",
                "requestBody": {"content": {"application/json": {"schema": extender}}},
                "responses": {"200": {"description": "HostPriorityList"}}}},
            "/healthz": {"get": {"summary": "health",
                                 "responses": {"200": {"description": "ok"}}}},
        },
        "components": {"schemas": schemas.get("$defs", {})},
    }


def make_app(source: HistorySource, config: PlacementConfig | None = None,
             clock_ms: Callable[[], int] = now_ms) -> Starlette:
    config = config or PlacementConfig()
    document = openapi_document()

    def answer(request: RecommendRequest) -> Recommendation:
        return recommend(source.get(), request, clock_ms(), config)

    def unavailable(exc: Exception) -> JSONResponse:
        log.warning("placement: history unreadable: %s", exc)
        return JSONResponse({"error": f"history unreadable: {type(exc).__name__}: {exc}"},
                            status_code=503)

    async def recommend_route(request: Request) -> JSONResponse:
        try:
            if request.method == "POST":
                asked = RecommendRequest.model_validate_json(await request.body())
            else:
                params = dict(request.query_params)
                if "communicating" in params:
                    params["communicating"] = params["communicating"].lower() in (
                        "1", "true", "yes")
                asked = RecommendRequest.model_validate(params)
        except ValidationError as exc:
            return JSONResponse({"error": exc.errors(include_url=False,
                                                     include_context=False)},
                                status_code=400)
        try:
            return JSONResponse(answer(asked).model_dump(mode="json"))
        except Exception as exc:  # a store that is down is the service's problem, said so
            return unavailable(exc)

    async def extender_route(request: Request) -> JSONResponse:
        verb = request.path_params["verb"]
        if verb not in ("filter", "prioritize"):
            return JSONResponse({"error": f"no extender verb {verb}"}, status_code=404)
        try:
            args = await request.json()
            asked = pod_request(args)
        except Exception as exc:
            # kube-scheduler reads ``error`` of a filter result; a bad body is said there.
            body = {"error": f"bad ExtenderArgs: {exc}"} if verb == "filter" else []
            return JSONResponse(body, status_code=400)
        try:
            found = answer(asked)
        except Exception as exc:
            return unavailable(exc)
        if verb == "filter":
            return JSONResponse(filter_nodes(args, found))
        return JSONResponse(prioritize_nodes(args, found, config.unknown_score))

    async def openapi(_request: Request) -> JSONResponse:
        return JSONResponse(document)

    async def healthz(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[
        Route("/v1/recommend", recommend_route, methods=["GET", "POST"]),
        Route("/scheduler/{verb:str}", extender_route, methods=["POST"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ])
