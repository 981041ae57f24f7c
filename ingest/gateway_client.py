"""The probe's side of the ingest gateway: registration and metric posts over one kept-alive
HTTP connection, each answer sorted into sent, try again, or refused for good.

The bearer token given is the gateway's enrolment token (the first registration answers
with this worker's own token, used from then on) or this worker's runtime token (which is
what a worker restarting under the same id needs: the enrolment token registers a new
worker only). A post refused as unauthorised or for an unknown runtime registers again.
"""

from __future__ import annotations

import enum
import http.client
import ssl
import urllib.parse
from dataclasses import dataclass

import orjson

from dsec.schemas import RuntimeRegistration

MAX_ANSWER_BYTES = 65536
# A registration refused for what it says (a conflict, a bad id) waits this long: it will
# not change by itself, and an operator may be fixing it.
REFUSED_REGISTRATION_RETRY_S = 30.0


class Outcome(enum.Enum):
    SENT = "sent"
    RETRY = "retry"  # keep the batch, try again later
    REFUSED = "refused"  # the gateway will never take this batch


@dataclass(frozen=True)
class Answer:
    outcome: Outcome
    detail: str = ""
    retry_after_s: float = 0.0  # at least this long before the next try


def parse_endpoint(endpoint: str) -> urllib.parse.SplitResult:
    """``http(s)://host[:port][/prefix]``; ``ValueError`` naming what is wrong."""
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"endpoint must be an http:// or https:// URL, got {endpoint!r}")
    _port = parts.port  # raises ValueError for a port that is not a number in range
    return parts


class GatewayClient:
    def __init__(self, endpoint: str, token: str, registration: RuntimeRegistration,
                 timeout_s: float) -> None:
        self._url = parse_endpoint(endpoint)
        self._base_path = self._url.path.rstrip("/")
        self._given_token = token
        self._token = token
        self._registration = registration
        self._metrics_path = f"/v1/runtimes/{registration.runtime_id}/metrics"
        self._timeout_s = timeout_s
        self._connection: http.client.HTTPConnection | None = None
        self.registered = False

    @property
    def endpoint(self) -> str:
        return self._url.geturl()

    def post_batch(self, body: bytes) -> Answer:
        """Posts one batch (the gateway's ``RuntimeMetricsPost`` as JSON), registering
        first when needed."""
        if not self.registered:
            answer = self._register()
            if answer.outcome is not Outcome.SENT:
                return answer
        try:
            status, retry_after_s, text = self._post(self._metrics_path, body)
        except (OSError, http.client.HTTPException) as exc:
            return Answer(Outcome.RETRY, f"gateway {self.endpoint} unreachable: {exc}")
        if 200 <= status < 300:
            return Answer(Outcome.SENT)
        if status in (401, 403, 404):  # the token was revoked, or the gateway forgot us
            self.registered = False
            self._token = self._given_token
            return Answer(Outcome.RETRY, f"HTTP {status}: registering again")
        if status in (408, 429) or status >= 500:
            return Answer(Outcome.RETRY, f"HTTP {status}: {text}", retry_after_s)
        return Answer(Outcome.REFUSED, f"HTTP {status}: {text}")

    def _register(self) -> Answer:
        body = self._registration.model_dump_json(exclude_none=True).encode()
        try:
            status, retry_after_s, text = self._post("/v1/runtimes", body)
        except (OSError, http.client.HTTPException) as exc:
            return Answer(Outcome.RETRY, f"gateway {self.endpoint} unreachable: {exc}")
        if status == 201:
            try:
                self._token = str(orjson.loads(text)["token"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                return Answer(Outcome.RETRY, "the gateway registered this worker but sent "
                              "no token", REFUSED_REGISTRATION_RETRY_S)
            self.registered = True
            return Answer(Outcome.SENT)
        if status == 200:  # the token given is this worker's own: it stays
            self.registered = True
            return Answer(Outcome.SENT)
        if status in (408, 429) or status >= 500:
            return Answer(Outcome.RETRY, f"registration: HTTP {status}: {text}", retry_after_s)
        worker = self._registration.runtime_id
        detail = (f"worker {worker} is registered already: give it its own runtime token "
                  "(the enrolment token registers a new worker only)" if status == 409
                  else f"the gateway refused to register worker {worker}: HTTP {status}: "
                  f"{text}")
        return Answer(Outcome.RETRY, detail, REFUSED_REGISTRATION_RETRY_S)

    def _connect(self) -> http.client.HTTPConnection:
        host, port = self._url.hostname or "", self._url.port
        if self._url.scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=self._timeout_s,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(host, port, timeout=self._timeout_s)

    def _post(self, path: str, body: bytes) -> tuple[int, float, str]:
        """(status, Retry-After in seconds or 0, the answer's text). A kept-alive
        connection the server closed while idle is opened again once."""
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "Authorization": f"Bearer {self._token}"}
        for attempt in range(2):
            reused = self._connection is not None
            connection = self._connection or self._connect()
            self._connection = connection
            try:
                connection.request("POST", self._base_path + path, body=body, headers=headers)
                response = connection.getresponse()
                text = response.read(MAX_ANSWER_BYTES).decode(errors="replace")
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if reused and attempt == 0:
                    continue
                raise
            except (OSError, http.client.HTTPException):
                self.close()
                raise
            if response.will_close or not response.isclosed():
                self.close()  # not all of it was read, or the server ends the connection
            retry_after = response.getheader("Retry-After", "")
            return response.status, float(retry_after) if retry_after.isdigit() else 0.0, text
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
