"""JSON Schema of every wire model, for other languages and editors."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from dsec.schemas.actuations import ActuationCommand, ActuationResult
from dsec.schemas.dead_letters import DeadLetter
from dsec.schemas.feature_columns import FeatureColumns
from dsec.schemas.features import FeatureEvent
from dsec.schemas.metrics import MetricBatch, PackedColumn
from dsec.schemas.policies import PolicyDecision, PolicySpec
from dsec.schemas.pools import PoolSpec
from dsec.schemas.runtimes import RuntimeMetricsPost, RuntimeRegistration

WIRE_MODELS: dict[str, type[BaseModel]] = {
    "metric_batch": MetricBatch,
    "packed_column": PackedColumn,
    "feature_event": FeatureEvent,
    "feature_columns": FeatureColumns,
    "policy_spec": PolicySpec,
    "policy_decision": PolicyDecision,
    "pool_spec": PoolSpec,
    "actuation_command": ActuationCommand,
    "actuation_result": ActuationResult,
    "dead_letter": DeadLetter,
    "runtime_registration": RuntimeRegistration,
    "runtime_metrics_post": RuntimeMetricsPost,
}


def export_json_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in WIRE_MODELS.items():
        path = directory / f"{name}.schema.json"
        path.write_text(json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
