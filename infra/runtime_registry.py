"""Registered runtimes and their bearer tokens, kept in memory and in a JSON file so a
restarted gateway knows them.

Changes are made in memory; ``flush`` writes the file, and is blocking I/O for a caller to
run off its event loop. Flushes coalesce: one that finds the file current writes nothing.
Tokens are kept as their SHA-256, never as given.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
from pathlib import Path

from dsec.schemas import RegisteredRuntime, RuntimeRegistration


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class RuntimeRegistry:
    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._runtimes: dict[str, RegisteredRuntime] = {}
        self._owners: dict[str, str] = {}  # token digest -> runtime id
        self._version = 0
        self._saved_version = 0
        if path is not None and path.exists():
            for raw in json.loads(path.read_text()):
                self._keep(RegisteredRuntime.model_validate(raw))

    def _keep(self, runtime: RegisteredRuntime) -> None:
        runtime_id = runtime.registration.runtime_id
        previous = self._runtimes.get(runtime_id)
        if previous is not None and previous.token_sha256 is not None:
            self._owners.pop(previous.token_sha256, None)
        self._runtimes[runtime_id] = runtime
        if runtime.token_sha256 is not None:
            self._owners[runtime.token_sha256] = runtime_id

    def put(self, registration: RuntimeRegistration) -> bool:
        """Adds or replaces a runtime's registration, keeping its token; True when new."""
        with self._lock:
            previous = self._runtimes.get(registration.runtime_id)
            self._keep(RegisteredRuntime(
                registration=registration,
                token_sha256=previous.token_sha256 if previous is not None else None,
            ))
            self._version += 1
        return previous is None

    def enrol(self, registration: RuntimeRegistration) -> str | None:
        """Adds a new runtime with a token of its own and returns the token; None, changing
        nothing, when the runtime is registered already."""
        token = secrets.token_urlsafe(32)
        with self._lock:
            if registration.runtime_id in self._runtimes:
                return None
            self._keep(RegisteredRuntime(registration=registration,
                                         token_sha256=token_digest(token)))
            self._version += 1
        return token

    def forget(self, runtime_id: str) -> None:
        """Removes a runtime and its token."""
        with self._lock:
            runtime = self._runtimes.pop(runtime_id, None)
            if runtime is None:
                return
            if runtime.token_sha256 is not None:
                self._owners.pop(runtime.token_sha256, None)
            self._version += 1

    def issue_token(self, runtime_id: str) -> str:
        """A new bearer token for a registered runtime; the one it had stops working."""
        token = secrets.token_urlsafe(32)
        with self._lock:
            runtime = self._runtimes[runtime_id]
            self._keep(runtime.model_copy(update={"token_sha256": token_digest(token)}))
            self._version += 1
        return token

    def revoke_token(self, runtime_id: str) -> bool:
        """The runtime's token stops working; False when it had none."""
        with self._lock:
            runtime = self._runtimes.get(runtime_id)
            if runtime is None or runtime.token_sha256 is None:
                return False
            self._keep(runtime.model_copy(update={"token_sha256": None}))
            self._version += 1
        return True

    def owner_of(self, token: str) -> str | None:
        """The runtime whose token ``token`` is, if any."""
        # a lookup by digest: timing tells an attacker about digests, not about tokens
        with self._lock:
            return self._owners.get(token_digest(token))

    def get(self, runtime_id: str) -> RuntimeRegistration | None:
        with self._lock:
            runtime = self._runtimes.get(runtime_id)
        return None if runtime is None else runtime.registration

    def all(self) -> list[RuntimeRegistration]:
        with self._lock:
            return [runtime.registration for runtime in self._runtimes.values()]

    def flush(self) -> None:
        """Writes the file if it is behind memory (blocking I/O)."""
        if self._path is None:
            return
        with self._write_lock:
            with self._lock:
                if self._version == self._saved_version:
                    return
                version = self._version
                snapshot = [r.model_dump(mode="json") for r in self._runtimes.values()]
            self._write(json.dumps(snapshot, indent=1))
            self._saved_version = version

    def _write(self, text: str) -> None:
        assert self._path is not None
        self._path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self._path.with_suffix(".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
        os.replace(temporary, self._path)  # readers never see half a file
