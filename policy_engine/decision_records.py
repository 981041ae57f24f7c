"""What the engine writes about a decision: the command id derived from its cause, the
alert text rendered from a policy's template, and the audit record."""

from __future__ import annotations

import hashlib
import re

from dsec.schemas import FeatureEvent, PolicyDecision
from dsec.schemas.policies import DecisionKind, PolicySpec

__all__ = ["actuation_id", "decision_record", "render_alert", "values_seen"]

_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


def actuation_id(*parts: object) -> str:
    """Derived from what caused the command, so a replayed event yields the same id and
    the actuator, idempotent by id, applies it once."""
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:32]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def render_alert(template: str, spec: PolicySpec, event: FeatureEvent,
                 features: dict[str, float] | None = None) -> str:
    """Substitutes ``{name}`` from identity, tags, the features the condition saw
    (``features``, else the event's) and parameters; nothing else is run."""
    seen = event.features if features is None else features
    values = {
        **{k: _number(v) for k, v in spec.params.items()},
        **{k: _number(v) for k, v in seen.items()},
        **event.tags,
        "job_id": event.identity.job_id,
        "worker_id": event.identity.worker_id,
        "node_id": event.identity.node_id,
        "gpu_uuid": event.gpu_uuid or "unknown",
    }
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), "unknown"), template)


def values_seen(seen: dict[str, tuple[float, float]]) -> dict[str, float]:
    """The values of ``seen`` (value and age in seconds, by name), without their ages."""
    return {name: value for name, (value, _age_s) in seen.items()}


def decision_record(spec: PolicySpec, event: FeatureEvent, kind: DecisionKind, stage: int,
              detail: str, actuation: str | None = None,
              features: dict[str, float] | None = None) -> PolicyDecision:
    """The audit record of a decision on ``event``'s target, naming its alert (rendered
    with ``features``, the values the condition saw) and GPU."""
    return PolicyDecision(
        event_time_ms=event.event_time_ms, policy_name=spec.name,
        policy_version=spec.version, identity=event.identity, decision=kind,
        stage=stage, actuation_id=actuation, detail=detail[:2048],
        alert=render_alert(spec.alert, spec, event, features)[:256] if spec.alert else None,
        gpu_uuid=event.gpu_uuid, gpu_model=event.tags.get("gpu_model", ""),
    )
