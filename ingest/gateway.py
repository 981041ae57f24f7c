"""HTTP ingest for runtimes that are not Python: register, then post metric samples.

Every request carries ``Authorization: Bearer <token>``. The gateway's enrolment token
registers a new runtime, and the answer holds that runtime's own token; from then on only
that token writes the runtime (re-registration, samples), and it can be revoked. Accepted
samples become one ``MetricBatch`` on the same metrics topic as the Python probes', keyed by
the runtime id; the answer comes after Kafka has the batch, so a runtime that gets 2xx may
forget it. Errors are JSON: ``{"error": code, "detail": text, "problems": [{"field",
"message"}]}``, and each is counted by its code.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dsec.infra.observability.metrics import EVENTS_IN, REQUESTS_REJECTED, ProcessMetrics
from dsec.infra.runtime_registry import RuntimeRegistry
from dsec.infra.token_bucket import TokenBuckets
from dsec.infra.webhook_targets import check_target, parse_networks
from dsec.ingest.gateway_config import GatewayConfig
from dsec.ingest.gateway_publisher import BatchPublisher, PublishError
from dsec.ingest.json_body import BodyError, parse_strict, read_limited
from dsec.schemas import (
    MetricBatch,
    RuntimeMetricsPost,
    RuntimeRegistration,
    RuntimeSample,
    WorkerIdentity,
    encode,
    new_event_id,
    now_ms,
)

log = logging.getLogger(__name__)
SERVICE = "ingest-gateway"
_BODY_STATUS = {"too_large": 413, "invalid_json": 400, "too_deep": 400}


class GatewayError(Exception):
    def __init__(
        self, status: int, error: str, detail: str, problems: list[dict[str, str]] | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.problems = problems or []
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        body: dict[str, Any] = {"error": self.error, "detail": self.detail}
        if self.problems:
            body["problems"] = self.problems
        headers: dict[str, str] = {}
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(self.retry_after_s)
        return JSONResponse(body, status_code=self.status, headers=headers or None)


def batch_event_id(runtime_id: str, batch_id: str | None) -> str:
    """The message id of a posted batch: derived from the runtime and its own batch id, so
    that a retried post is one message downstream and one runtime's ids can never match
    another's; a fresh id when the runtime names none."""
    if batch_id is None:
        return new_event_id()
    return hashlib.sha256(f"{runtime_id}\x00{batch_id}".encode()).hexdigest()[:32]


def validation_problems(exc: ValidationError) -> list[dict[str, str]]:
    """Pydantic errors as ``{"field": "samples.0.reward", "message": ...}``, most useful first."""
    return [
        {"field": ".".join(str(part) for part in err["loc"]) or "<body>", "message": err["msg"]}
        for err in exc.errors()[:20]
    ]


@dataclass(frozen=True)
class Caller:
    """Who presented the bearer token: the enrolment or admin token, or one runtime's."""

    kind: str  # "enrolment", "admin" or "runtime"
    runtime_id: str | None = None

    @property
    def key(self) -> str:
        return self.runtime_id if self.runtime_id is not None else f"<{self.kind}>"

    def owns(self, runtime_id: str) -> bool:
        return self.kind == "runtime" and self.runtime_id == runtime_id


class IngestGateway:
    def __init__(
        self,
        config: GatewayConfig,
        registry: RuntimeRegistry,
        publisher: BatchPublisher,
        default_job_id: str,
        metrics: ProcessMetrics | None = None,
        rate_limits: TokenBuckets | None = None,
    ) -> None:
        """``metrics``: what ``/metrics`` serves and ``/healthz`` checks. ``rate_limits``:
        one bucket per caller, by default ``config.rate_per_s`` with ``config.rate_burst``."""
        self._config = config
        self.metrics = metrics or ProcessMetrics()
        self._batches_in = self.metrics.counter(EVENTS_IN).labels(SERVICE, "http")
        self._rejected = self.metrics.counter(REQUESTS_REJECTED)
        self._enrolment_token = config.token.get_secret_value().encode()
        admin = config.admin_token
        self._admin_token = admin.get_secret_value().encode() if admin is not None else None
        self._allowed_networks = parse_networks(config.webhook_allowed_networks)
        self._rate_limits = rate_limits or TokenBuckets(config.rate_per_s, config.rate_burst)
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
            Route("/v1/runtimes/{runtime_id}/token", self._revoke, methods=["DELETE"]),
            Route("/v1/runtimes/{runtime_id}/token", self._reissue, methods=["POST"]),
        ])

    # --- request plumbing -----------------------------------------------------------------

    def _caller(self, request: Request) -> Caller:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token:
            given = token.encode()
            if hmac.compare_digest(given, self._enrolment_token):
                return Caller("enrolment")
            if self._admin_token is not None and hmac.compare_digest(given, self._admin_token):
                return Caller("admin")
            runtime_id = self._registry.owner_of(token)
            if runtime_id is not None:
                return Caller("runtime", runtime_id)
        raise GatewayError(401, "unauthorized", "missing or wrong bearer token")

    def _limit_rate(self, caller: Caller) -> None:
        wait_s = self._rate_limits.take(caller.key)
        if wait_s > 0:
            raise GatewayError(
                429, "rate_limited",
                f"over {self._config.rate_per_s:g} requests a second for {caller.key}",
                retry_after_s=max(1, math.ceil(wait_s)),
            )

    async def _raw_body(self, request: Request) -> bytes:
        limit = self._config.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:  # refused before it is read
            raise GatewayError(413, "too_large", f"body over {limit} bytes")
        try:
            async with asyncio.timeout(self._config.body_timeout_s):
                return await read_limited(request.stream(), limit)
        except TimeoutError:
            raise GatewayError(
                408, "body_timeout", f"the body did not arrive within "
                f"{self._config.body_timeout_s:g} s") from None
        except BodyError as exc:
            raise GatewayError(_BODY_STATUS[exc.code], exc.code, exc.detail) from None

    async def _body(self, request: Request, model: type[BaseModel]) -> Any:
        raw = await self._raw_body(request)
        try:
            parse_strict(raw, self._config.max_json_depth)
        except BodyError as exc:
            raise GatewayError(_BODY_STATUS[exc.code], exc.code, exc.detail) from None
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
            caller = self._caller(request)
            self._limit_rate(caller)
            return await handler(request, caller)
        except GatewayError as exc:
            self._rejected.labels(SERVICE, exc.error).inc()
            return exc.response()
        except PublishError as exc:
            log.warning("dsec gateway: batch not published: %s", exc)
            self._rejected.labels(SERVICE, "unavailable").inc()
            return GatewayError(503, "unavailable", f"not stored, try again: {exc}").response()

    async def _persist(self) -> None:
        await asyncio.to_thread(self._registry.flush)

    def _identity(self, registration: RuntimeRegistration) -> WorkerIdentity:
        return registration.identity(self._default_job_id)

    async def _check_webhook(self, registration: RuntimeRegistration) -> None:
        if registration.webhook_url is None:
            return
        url = str(registration.webhook_url)
        problem = await asyncio.to_thread(check_target, url, self._allowed_networks)
        if problem is not None:
            raise GatewayError(422, "invalid_request", f"webhook_url: {problem}",
                               [{"field": "webhook_url", "message": problem}])

    def _registered(self, runtime_id: str) -> RuntimeRegistration:
        registration = self._registry.get(runtime_id)
        if registration is None:
            raise GatewayError(404, "unknown_runtime",
                               f"runtime {runtime_id!r} is not registered: POST /v1/runtimes first")
        return registration

    @staticmethod
    def _forbidden(caller: Caller, runtime_id: str) -> GatewayError:
        return GatewayError(403, "forbidden",
                            f"the token presented ({caller.key}) may not write {runtime_id!r}")

    # --- routes --------------------------------------------------------------------------

    async def _health(self, _request: Request) -> JSONResponse:
        healthy, checks = self.metrics.health()
        return JSONResponse({"status": "ok" if healthy else "unhealthy", "checks": checks},
                            status_code=200 if healthy else 503)

    async def _prometheus(self, _request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def _publish_registration(self, registration: RuntimeRegistration) -> MetricBatch:
        sample = RuntimeSample(
            event_time_ms=now_ms(), runtime_type=registration.runtime_type,
            concurrency=registration.concurrency,
            mean_call_latency_ms=registration.mean_call_latency_ms,
            function_calling=registration.function_calling,
        )
        batch = MetricBatch(identity=self._identity(registration), samples=[sample])
        await self._publisher.publish(registration.runtime_id.encode(), encode(batch))
        self._batches_in.inc()
        return batch

    async def _register(self, request: Request) -> JSONResponse:
        async def handle(req: Request, caller: Caller) -> JSONResponse:
            if caller.kind == "admin":
                raise GatewayError(403, "forbidden", "the admin token does not register "
                                   "runtimes: use the enrolment token")
            registration: RuntimeRegistration = await self._body(req, RuntimeRegistration)
            runtime_id = registration.runtime_id
            if caller.kind == "runtime" and not caller.owns(runtime_id):
                raise self._forbidden(caller, runtime_id)
            if caller.kind == "enrolment" and self._registry.get(runtime_id) is not None:
                raise GatewayError(409, "already_registered",
                                   f"runtime {runtime_id!r} is registered: only its own token "
                                   "changes its registration")
            await self._check_webhook(registration)
            token = None
            if caller.kind == "enrolment":
                token = self._registry.enrol(registration)
                if token is None:
                    raise GatewayError(409, "already_registered",
                                       f"runtime {runtime_id!r} is registered")
            try:
                batch = await self._publish_registration(registration)
            except PublishError:
                if token is not None:
                    self._registry.forget(runtime_id)
                raise
            if token is None:
                self._registry.put(registration)
            await self._persist()
            answer: dict[str, Any] = {"runtime_id": runtime_id, "registered": True,
                                      "identity": batch.identity.model_dump()}
            if token is not None:
                answer["token"] = token
            return JSONResponse(answer, status_code=201 if token is not None else 200)

        return await self._handle(request, handle)

    async def _show(self, request: Request) -> JSONResponse:
        async def handle(req: Request, caller: Caller) -> JSONResponse:
            runtime_id = req.path_params["runtime_id"]
            registration = self._registered(runtime_id)
            if caller.kind == "runtime" and not caller.owns(runtime_id):
                raise GatewayError(403, "forbidden",
                                   f"the token presented ({caller.key}) may not read "
                                   f"{runtime_id!r}")
            return JSONResponse(registration.model_dump(mode="json"))

        return await self._handle(request, handle)

    async def _metrics(self, request: Request) -> JSONResponse:
        async def handle(req: Request, caller: Caller) -> JSONResponse:
            registration = self._registered(req.path_params["runtime_id"])
            if not caller.owns(registration.runtime_id):
                raise self._forbidden(caller, registration.runtime_id)
            posted: RuntimeMetricsPost = await self._body(req, RuntimeMetricsPost)
            batch = MetricBatch(
                event_id=batch_event_id(registration.runtime_id, posted.batch_id),
                identity=self._identity(registration), samples=posted.samples,
                columns=posted.columns,
            )
            await self._publisher.publish(registration.runtime_id.encode(), encode(batch))
            self._batches_in.inc()
            accepted = batch.sample_count()
            self.samples_accepted += accepted
            return JSONResponse(
                {"accepted": accepted, "batch_id": batch.event_id}, status_code=202
            )

        return await self._handle(request, handle)

    async def _revoke(self, request: Request) -> JSONResponse:
        async def handle(req: Request, caller: Caller) -> JSONResponse:
            runtime_id = self._registered(req.path_params["runtime_id"]).runtime_id
            if caller.kind != "admin" and not caller.owns(runtime_id):
                raise GatewayError(403, "forbidden", "a runtime's token is revoked by the "
                                   "runtime itself or with the admin token")
            revoked = self._registry.revoke_token(runtime_id)
            await self._persist()
            return JSONResponse({"runtime_id": runtime_id, "revoked": revoked})

        return await self._handle(request, handle)

    async def _reissue(self, request: Request) -> JSONResponse:
        async def handle(req: Request, caller: Caller) -> JSONResponse:
            runtime_id = self._registered(req.path_params["runtime_id"]).runtime_id
            if caller.kind != "admin":
                raise GatewayError(403, "forbidden", "a new runtime token needs the admin token")
            token = self._registry.issue_token(runtime_id)
            await self._persist()
            return JSONResponse({"runtime_id": runtime_id, "token": token})

        return await self._handle(request, handle)
