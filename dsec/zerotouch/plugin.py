"""The dsec plugin entry, where a framework or a project keeps it, and the plugin hook.

``dsec run`` reads the entry from ``--config FILE``, else ``dsec.yaml`` in the working
folder, else ``[tool.dsec]`` of ``pyproject.toml`` there. In a YAML file it is either the
whole file, a ``dsec:`` mapping, or the entry named ``dsec`` of a ``plugins:`` list (its
``config:`` mapping), as a framework that loads plugins from its config file lists it::

    plugins:
      - name: dsec
        module: dsec.zerotouch.plugin
        config: {endpoint: "kafka://kafka:9092", heartbeat_interval_s: 5, sandbox_id: sbx-7}

A framework that loads such plugins itself calls ``register(entry["config"])`` in the
training process: that instruments it as ``dsec run`` would, without ``dsec run``.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dsec.zerotouch.config import ZeroTouchConfig
from dsec.zerotouch.session import ZeroTouch, install

PLUGIN_NAME = "dsec"
DEFAULT_FILES = ("dsec.yaml", "dsec.yml")


class PluginConfigError(ValueError):
    pass


def entry_of(document: Any, source: str) -> Mapping[str, Any]:
    """The dsec entry in a parsed YAML document (see the module's documentation)."""
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise PluginConfigError(f"{source}: expected a mapping")
    if "plugins" in document:
        for plugin in document["plugins"] or ():
            if isinstance(plugin, Mapping) and plugin.get("name") == PLUGIN_NAME:
                return plugin.get("config") or {}
        return {}
    if PLUGIN_NAME in document:
        return document[PLUGIN_NAME] or {}
    return document


def read_config(path: Path | None = None, cwd: Path | None = None) -> ZeroTouchConfig:
    """The entry in ``path``, or in the working folder's ``dsec.yaml`` or ``pyproject.toml``
    (none: the defaults, every setting then from ``DSEC_*`` variables)."""
    cwd = cwd or Path.cwd()
    if path is None:
        path = next((cwd / name for name in DEFAULT_FILES if (cwd / name).is_file()), None)
    if path is None and (cwd / "pyproject.toml").is_file():
        path = cwd / "pyproject.toml"
    if path is None:
        return ZeroTouchConfig()
    try:
        if path.suffix == ".toml":
            entry = tomllib.loads(path.read_text()).get("tool", {}).get(PLUGIN_NAME, {})
        else:
            entry = entry_of(yaml.safe_load(path.read_text()), str(path))
        return ZeroTouchConfig.model_validate(entry)
    except (OSError, ValueError, yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise PluginConfigError(f"{path}: {exc}") from None


def register(config: Mapping[str, Any] | ZeroTouchConfig | None = None) -> ZeroTouch:
    """The plugin hook: instruments this process with ``config`` (the entry's mapping),
    whose settings win over the ``DSEC_*`` variables already set."""
    entry = (config if isinstance(config, ZeroTouchConfig)
             else ZeroTouchConfig.model_validate(config or {}))
    os.environ.update(entry.environment())  # this process runs already: hooks, not a path
    return install()
