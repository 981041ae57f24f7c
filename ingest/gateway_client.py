"""The probe's side of the ingest gateway: registration and metric posts over one kept-alive
HTTP connection, each answer sorted into sent, try again, or refused for good.

The bearer token given is the gateway's enrolment token (the first registration answers
with this worker's own token, used from then on) or this worker's runtime token (which is
what a worker restarting under the same id needs: the enrolment token registers a new
worker only). A post refused as unauthorised or for an unknown runtime registers again.
``sibling`` is a second client on a connection of its own that shares the registration and
the token: a worker's command poll, held open for seconds, beside its metric posts.
"""

from __future__ import annotations

import contextlib
import enum
import http.client
import logging
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field

import orjson

from dsec.schemas import RuntimeRegistration

log = logging.getLogger(__name__)

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


@dataclass
class _Credentials:
    """The token in use, shared by a client and its siblings."""

    given: str
    token: str
    registered: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class GatewayClient:
    def __init__(self, endpoint: str, token: str, registration: RuntimeRegistration,
                 timeout_s: float, credentials: _Credentials | None = None) -> None:
        self._url = parse_endpoint(endpoint)
        self._base_path = self._url.path.rstrip("/")
        self._credentials = credentials or _Credentials(token, token)
        self._registration = registration
        runtime_path = f"/v1/runtimes/{registration.runtime_id}"
        self._metrics_path = f"{runtime_path}/metrics"
        self._commands_path = f"{runtime_path}/commands"
        self._results_path = f"{runtime_path}/results"
        self._timeout_s = timeout_s
        self._connection: http.client.HTTPConnection | None = None

    @property
    def endpoint(self) -> str:
        return self._url.geturl()

    @property
    def registered(self) -> bool:
        return self._credentials.registered

    @property
    def _token(self) -> str:
        return self._credentials.token

    def sibling(self, timeout_s: float) -> GatewayClient:
        """A client on a connection of its own, with this one's registration and token."""
        return GatewayClient(self.endpoint, self._credentials.given, self._registration,
                             timeout_s, self._credentials)

    def post_batch(self, body: bytes) -> Answer:
        """Posts one batch (the gateway's ``RuntimeMetricsPost`` as JSON), registering
        first when needed."""
        return self._send(self._metrics_path, body)

    def post_result(self, body: bytes) -> Answer:
        """Posts one ``ActuationResult`` (JSON) of a command this worker fetched."""
        return self._send(self._results_path, body)

    def fetch_commands(self, wait_s: float) -> tuple[Answer, list[bytes]]:
        """The signed commands waiting for this worker (each a command's JSON), asked with
        a poll the gateway holds open up to ``wait_s``; none with an answer saying why."""
        answer = self._ensure_registered()
        if answer.outcome is not Outcome.SENT:
            return answer, []
        try:
            status, retry_after_s, text = self._request(
                "GET", f"{self._commands_path}?wait_s={wait_s:g}", None,
                self._timeout_s + wait_s)
        except (OSError, http.client.HTTPException) as exc:
            return Answer(Outcome.RETRY, f"gateway {self.endpoint} unreachable: {exc}"), []
        if status == 204:
            return Answer(Outcome.SENT), []
        if status == 200:
            try:
                commands = orjson.loads(text)["commands"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                return Answer(Outcome.RETRY, "the gateway's commands were not JSON"), []
            return Answer(Outcome.SENT), [orjson.dumps(command) for command in commands]
        return self._failed(status, retry_after_s, text, any_404_forgets=False), []

    def _send(self, path: str, body: bytes) -> Answer:
        answer = self._ensure_registered()
        if answer.outcome is not Outcome.SENT:
            return answer
        try:
            status, retry_after_s, text = self._post(path, body)
        except (OSError, http.client.HTTPException) as exc:
            return Answer(Outcome.RETRY, f"gateway {self.endpoint} unreachable: {exc}")
        if 200 <= status < 300:
            return Answer(Outcome.SENT)
        return self._failed(status, retry_after_s, text,
                            any_404_forgets=path == self._metrics_path)

    def _failed(self, status: int, retry_after_s: float, text: str, *,
                any_404_forgets: bool) -> Answer:
        """``any_404_forgets``: a 404 means the gateway forgot this worker (a metric post);
        on the command routes only one that says so does (a gateway that does not hand
        out commands, or a result it did not ask for, answers 404 too)."""
        forgotten = status == 404 and (any_404_forgets or "unknown_runtime" in text)
        if status in (401, 403) or forgotten:
            # the token was revoked, or the gateway forgot us
            with self._credentials.lock:
                self._credentials.registered = False
                self._credentials.token = self._credentials.given
            return Answer(Outcome.RETRY, f"HTTP {status}: registering again")
        if status in (408, 429) or status >= 500:
            return Answer(Outcome.RETRY, f"HTTP {status}: {text}", retry_after_s)
        return Answer(Outcome.REFUSED, f"HTTP {status}: {text}")

    def _ensure_registered(self) -> Answer:
        """Registers unless this client or a sibling has; one at a time, as a second
        registration with the enrolment token would be refused."""
        with self._credentials.lock:
            if self._credentials.registered:
                return Answer(Outcome.SENT)
            return self._register()

    def _register(self) -> Answer:
        body = self._registration.model_dump_json(exclude_none=True).encode()
        try:
            status, retry_after_s, text = self._post("/v1/runtimes", body)
        except (OSError, http.client.HTTPException) as exc:
            return Answer(Outcome.RETRY, f"gateway {self.endpoint} unreachable: {exc}")
        if status == 201:
            try:
                self._credentials.token = str(orjson.loads(text)["token"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                return Answer(Outcome.RETRY, "the gateway registered this worker but sent "
                              "no token", REFUSED_REGISTRATION_RETRY_S)
            self._credentials.registered = True
            return Answer(Outcome.SENT)
        if status == 200:  # the token given is this worker's own: it stays
            self._credentials.registered = True
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
        return self._request("POST", path, body, self._timeout_s)

    def _request(self, method: str, path: str, body: bytes | None,
                 timeout_s: float) -> tuple[int, float, str]:
        """(status, Retry-After in seconds or 0, the answer's text). A kept-alive
        connection the server closed while idle is opened again once."""
        headers = {"Accept": "application/json", "Authorization": f"Bearer {self._token}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        for attempt in range(2):
            reused = self._connection is not None
            connection = self._connection or self._connect()
            self._connection = connection
            connection.timeout = timeout_s
            if connection.sock is not None:
                connection.sock.settimeout(timeout_s)
            try:
                connection.request(method, self._base_path + path, body=body, headers=headers)
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

    def interrupt(self) -> None:
        """Ends a request under way on another thread (its read fails at once)."""
        connection = self._connection
        sock = connection.sock if connection is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):  # closed already
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class CommandPoller:
    """A worker's command poll (the in-process actuator's ``CommandPoll``) on a client of
    its own beside the metric posts; a lasting failure is logged once."""

    def __init__(self, client: GatewayClient) -> None:
        self._client = client
        self._problem = ""

    def fetch(self, wait_s: float) -> list[bytes] | None:
        answer, commands = self._client.fetch_commands(wait_s)
        if answer.outcome is Outcome.SENT:
            self._problem = ""
            return commands
        if answer.detail != self._problem:
            self._problem = answer.detail
            log.warning("dsec: commands not fetched: %s", answer.detail)
        return None

    def interrupt(self) -> None:
        self._client.interrupt()
