"""Post-import hooks: run a callback once a named module has finished importing.

A finder at the front of ``sys.meta_path`` finds the module through the finders behind
it and wraps its loader for the one ``exec_module``; once the module has run, the original
loader is put back on the module and its spec (``importlib.resources`` and friends read
it), then the callbacks run. A module already imported gets its callbacks at once. Only
standard-library imports here, and only cheap ones (not ``importlib.abc``: the import
system takes any object with these methods): the ``sitecustomize`` loads this in every
Python process ``dsec run`` starts, whether it trains or not.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

ModuleCallback = Callable[[ModuleType], None]


class _HookedLoader:
    def __init__(self, loader: Any, on_loaded: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._on_loaded = on_loaded

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._on_loaded(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class PostImportFinder:
    def __init__(self) -> None:
        self._callbacks: dict[str, list[ModuleCallback]] = {}
        self._finding = threading.local()

    def when_imported(self, name: str, callback: ModuleCallback) -> None:
        """Runs ``callback(module)`` once ``name`` is imported (now, if it already is)."""
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__spec__", None) is not None:
            self._run(name, module, [callback])
            return
        self._callbacks.setdefault(name, []).append(callback)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self._callbacks or getattr(self._finding, "active", False):
            return None
        self._finding.active = True
        spec = None
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._finding.active = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, lambda module: self._loaded(fullname, module))
        return spec

    def _loaded(self, name: str, module: ModuleType) -> None:
        self._run(name, module, self._callbacks.pop(name, []))

    @staticmethod
    def _run(name: str, module: ModuleType, callbacks: list[ModuleCallback]) -> None:
        for callback in callbacks:
            try:
                callback(module)
            except Exception:  # instrumentation never stops the program's import
                log.exception("dsec: instrumenting %s failed; it runs uninstrumented", name)


_finder: PostImportFinder | None = None


def post_import_finder() -> PostImportFinder:
    """The one finder of this process, first on ``sys.meta_path``."""
    global _finder
    if _finder is None:
        _finder = PostImportFinder()
        sys.meta_path.insert(0, _finder)
    return _finder


def when_imported(name: str, callback: ModuleCallback) -> None:
    post_import_finder().when_imported(name, callback)
