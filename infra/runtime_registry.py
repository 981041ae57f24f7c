"""Registered runtimes, kept in memory and in a JSON file so a restarted gateway knows them."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from dsec.schemas import RuntimeRegistration


class RuntimeRegistry:
    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._runtimes: dict[str, RuntimeRegistration] = {}
        if path is not None and path.exists():
            for raw in json.loads(path.read_text()):
                registration = RuntimeRegistration.model_validate(raw)
                self._runtimes[registration.runtime_id] = registration

    def put(self, registration: RuntimeRegistration) -> bool:
        """Adds or replaces a runtime; True when it is new."""
        with self._lock:
            new = registration.runtime_id not in self._runtimes
            self._runtimes[registration.runtime_id] = registration
            self._save()
        return new

    def get(self, runtime_id: str) -> RuntimeRegistration | None:
        with self._lock:
            return self._runtimes.get(runtime_id)

    def all(self) -> list[RuntimeRegistration]:
        with self._lock:
            return list(self._runtimes.values())

    def _save(self) -> None:
        if self._path is None:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self._path.with_suffix(".tmp")
        temporary.write_text(json.dumps(
            [r.model_dump(mode="json") for r in self._runtimes.values()], indent=1
        ))
        os.replace(temporary, self._path)  # readers never see half a file
