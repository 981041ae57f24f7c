"""Alerts in Alertmanager's webhook payload (version 4), so that any receiver written for
Alertmanager (a chat bridge, a pager) takes dsec's alerts as they are."""

from __future__ import annotations

from typing import Any

from dsec.schemas.alerts import AlertEvent, AlertStatus
from dsec.schemas.units import from_epoch_ms

__all__ = ["ZERO_TIME", "rfc3339", "webhook_payload"]

ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of an alert still firing


def rfc3339(epoch_ms: int) -> str:
    moment = from_epoch_ms(epoch_ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def _group_key(labels: dict[str, str]) -> str:
    inner = ",".join(f'{name}="{value}"' for name, value in sorted(labels.items()))
    return "{}:{" + inner + "}"


def webhook_payload(alert: AlertEvent, receiver: str, external_url: str = "") -> dict[str, Any]:
    """One notification for ``alert``: a group of its own, keyed by its alert name."""
    group = {"alertname": alert.labels.get("alertname", alert.alertname)}
    status = alert.status.value
    ends_at = (rfc3339(alert.ends_at_ms) if alert.status is AlertStatus.RESOLVED
               and alert.ends_at_ms is not None else ZERO_TIME)
    return {
        "version": "4",
        "groupKey": _group_key(group),
        "truncatedAlerts": 0,
        "status": status,
        "receiver": receiver,
        "groupLabels": group,
        "commonLabels": dict(alert.labels),
        "commonAnnotations": dict(alert.annotations),
        "externalURL": external_url,
        "alerts": [{
            "status": status,
            "labels": dict(alert.labels),
            "annotations": dict(alert.annotations),
            "startsAt": rfc3339(alert.starts_at_ms),
            "endsAt": ends_at,
            "generatorURL": "",
            "fingerprint": alert.fingerprint,
        }],
    }
