"""HTTP ingest for runtimes that are not Python: register, then post metric samples.

Every request carries ``Authorization: Bearer <token>``. Accepted samples become one
``MetricBatch`` on the same metrics topic as the Python probes', keyed by the runtime id;
the answer comes after Kafka has the batch, so a runtime that gets 2xx may forget it.
Errors are JSON: ``{"error": code, "detail": text, "problems": [{"field", "message"}]}``.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dsec.infra.observability.metrics import EVENTS_IN, ProcessMetrics
from dsec.infra.runtime_registry import RuntimeRegistry
from dsec.ingest.gateway_config import GatewayConfig
from dsec.ingest.gateway_publisher import BatchPublisher, PublishError
from dsec.schemas import (
    MetricBatch,
    RuntimeMetricsPost,
    RuntimeRegistration,
    RuntimeSample,
    WorkerIdentity,
    encode,
    now_ms,
)

log = logging.getLogger(__name__)
SERVICE = "ingest-gateway"


class GatewayError(Exception):
    def __init__(
        self, status: int, error: str, detail: str, problems: list[dict[str, str]] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.problems = problems or []

    def response(self) -> JSONResponse:
        body: dict[str, Any] = {"error": self.error, "detail": self.detail}
        if self.problems:
            body["problems"] = self.problems
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(body, status_code=self.status, headers=headers)


def validation_problems(exc: ValidationError) -> list[dict[str, str]]:
    """Pydantic errors as ``{"field": "samples.0.reward", "message": ...}``, most useful first."""
    return [
        {"field": ".".join(str(part) for part in err["loc"]) or "<body>", "message": err["msg"]}
        for err in exc.errors()[:20]
    ]


class IngestGateway:
    def __init__(
        self,
        config: GatewayConfig,
        registry: RuntimeRegistry,
        publisher: BatchPublisher,
        default_job_id: str,
        metrics: ProcessMetrics | None = None,
    ) -> None:
        """``metrics``: what ``/metrics`` serves and ``/healthz`` checks."""
        self._config = config
        self.metrics = metrics or ProcessMetrics()
        self._batches_in = self.metrics.counter(EVENTS_IN).labels(SERVICE, "http")
        self._token = config.token.get_secret_value().encode()
        self._registry = registry
        self._publisher = publisher
        self._default_job_id = default_job_id
        self.samples_accepted = 0

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/healthz", self._health, methods=["GET"]),
            Route("/metrics", self._prometheus, methods=["GET"]),
            Route("/v1/runtimes", self._register, methods=["POST"]),
            Route("/v1/runtimes/{runtime_id}", self._show, methods=["GET"]),
            Route("/v1/runtimes/{runtime_id}/metrics", self._metrics, methods=["POST"]),
        ])

    # --- request plumbing -----------------------------------------------------------------

    def _authorise(self, request: Request) -> None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), self._token):
            raise GatewayError(401, "unauthorized", "missing or wrong bearer token")

    async def _body(self, request: Request, model: type[BaseModel]) -> Any:
        limit = self._config.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:  # refused before it is read
            raise GatewayError(413, "too_large", f"body over {limit} bytes")
        raw = await request.body()
        if len(raw) > limit:
            raise GatewayError(413, "too_large", f"body over {limit} bytes")
        try:
            json.loads(raw)
        except ValueError as exc:
            raise GatewayError(400, "invalid_json", f"the body is not JSON: {exc}") from None
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            problems = validation_problems(exc)
            first = problems[0]
            raise GatewayError(
                422, "invalid_request",
                f"invalid {model.__name__}: {first['field']}: {first['message']}", problems,
            ) from None

    async def _handle(self, request: Request, handler: Any) -> JSONResponse:
        try:
            self._authorise(request)
            return await handler(request)
        except GatewayError as exc:
            return exc.response()
        except PublishError as exc:
            log.warning("dsec gateway: batch not published: %s", exc)
            return GatewayError(503, "unavailable", f"not stored, try again: {exc}").response()

    def _identity(self, registration: RuntimeRegistration) -> WorkerIdentity:
        return WorkerIdentity(
            job_id=registration.job_id or self._default_job_id,
            worker_id=registration.runtime_id,
            node_id=registration.node_id,
        )

    # --- routes --------------------------------------------------------------------------

    async def _health(self, _request: Request) -> JSONResponse:
        healthy, checks = self.metrics.health()
        return JSONResponse({"status": "ok" if healthy else "unhealthy", "checks": checks},
                            status_code=200 if healthy else 503)

    async def _prometheus(self, _request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def _register(self, request: Request) -> JSONResponse:
        async def handle(req: Request) -> JSONResponse:
            registration: RuntimeRegistration = await self._body(req, RuntimeRegistration)
            sample = RuntimeSample(
                event_time_ms=now_ms(), runtime_type=registration.runtime_type,
                concurrency=registration.concurrency,
                mean_call_latency_ms=registration.mean_call_latency_ms,
                function_calling=registration.function_calling,
            )
            batch = MetricBatch(identity=self._identity(registration), samples=[sample])
            await self._publisher.publish(registration.runtime_id.encode(), encode(batch))
            self._batches_in.inc()
            new = self._registry.put(registration)
            return JSONResponse(
                {"runtime_id": registration.runtime_id, "registered": True,
                 "identity": batch.identity.model_dump()},
                status_code=201 if new else 200,
            )

        return await self._handle(request, handle)

    def _registered(self, runtime_id: str) -> RuntimeRegistration:
        registration = self._registry.get(runtime_id)
        if registration is None:
            raise GatewayError(404, "unknown_runtime",
                               f"runtime {runtime_id!r} is not registered: POST /v1/runtimes first")
        return registration

    async def _show(self, request: Request) -> JSONResponse:
        async def handle(req: Request) -> JSONResponse:
            registration = self._registered(req.path_params["runtime_id"])
            return JSONResponse(registration.model_dump(mode="json"))

        return await self._handle(request, handle)

    async def _metrics(self, request: Request) -> JSONResponse:
        async def handle(req: Request) -> JSONResponse:
            registration = self._registered(req.path_params["runtime_id"])
            posted: RuntimeMetricsPost = await self._body(req, RuntimeMetricsPost)
            batch = MetricBatch(identity=self._identity(registration), samples=posted.samples)
            await self._publisher.publish(registration.runtime_id.encode(), encode(batch))
            self._batches_in.inc()
            self.samples_accepted += len(posted.samples)
            return JSONResponse(
                {"accepted": len(posted.samples), "batch_id": batch.event_id}, status_code=202
            )

        return await self._handle(request, handle)
