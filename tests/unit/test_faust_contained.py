"""Faust, mode and aiokafka internals are touched in one module only: infra/faust_app.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsec.infra import faust_app

ROOT = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("schemas", "infra", "ingest", "stream_jobs", "policy_engine", "actuators",
                  "bench", "dsec")
CONTAINER = ROOT / "infra" / "faust_app.py"
PRIVATE_NAMES = ("_current_event", "_verify_source_topic_partitions", "_ensure_producer",
                 "_committed_offset", "_paused_partitions", "_acked", "_fetcher",
                 "_ensure_consumer", "_subscriptions", "_unacked_messages", "_read_offset",
                 # dsec's own classes keep a ``self._thread``: the Faust consumer's is named
                 # through the consumer
                 r"consumer\._thread")
IMPORT = re.compile(r"^\s*(?:import|from)\s+(faust|mode|aiokafka)\b", re.MULTILINE)


def _sources() -> list[Path]:
    return sorted(path for folder in SOURCE_FOLDERS
                  for path in (ROOT / folder).rglob("*.py") if not path.is_symlink()
                  and not any(part.is_symlink() for part in path.relative_to(ROOT).parents
                              if part != Path(".")))


def test_only_faust_app_names_faust_mode_or_aiokafka_internals() -> None:
    found = {
        (str(path.relative_to(ROOT)), name)
        for path in _sources() if path != CONTAINER
        for name in PRIVATE_NAMES
        if re.search(rf"\b{name}\b", path.read_text())
    }
    assert found == set()


def test_only_faust_app_imports_faust_mode_or_aiokafka() -> None:
    found = {(str(path.relative_to(ROOT)), match) for path in _sources() if path != CONTAINER
             for match in IMPORT.findall(path.read_text())}
    assert found == set()


def test_the_installed_versions_have_every_internal_relied_on() -> None:
    faust_app.check_faust_internals()


def test_a_missing_internal_fails_naming_the_version_and_the_attribute(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(faust_app.aiokafka_driver.Producer, "_settings_extra")
    with pytest.raises(faust_app.FaustInternalsChanged) as raised:
        faust_app.make_faust_app("dsec-test", faust_app.DsecSettings(), partitions=1)
    import importlib.metadata
    assert raised.value.attribute == "_settings_extra"
    assert raised.value.version == importlib.metadata.version("faust-streaming")
    assert "_settings_extra" in str(raised.value)
    assert raised.value.version in str(raised.value)
