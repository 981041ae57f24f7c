"""The layering the import-linter contracts enforce, seen from a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "confluent_kafka", "faust", "aiokafka", "mode", "clickhouse_connect")


def _modules_after(statement: str) -> set[str]:
    code = f"{statement}; import json, sys; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return {name.split(".")[0] for name in json.loads(out.stdout)}


def test_importing_the_schemas_loads_no_runtime() -> None:
    loaded = _modules_after("import dsec.schemas, dsec.schemas.settings")
    assert not loaded & set(HEAVY)


def test_the_facade_resolves_its_names_on_first_use() -> None:
    assert not _modules_after("import dsec") & set(HEAVY)
    code = "import dsec, sys; dsec.init; print('dsec.facade' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "True"
