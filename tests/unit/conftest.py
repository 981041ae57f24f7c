"""The unit tier: no broker, no subprocess services; ``make test-fast`` runs it alone."""

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/unit/" in item.nodeid and "kafka_bootstrap" in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(f"{item.nodeid} needs the broker: move it to tests/integration")
