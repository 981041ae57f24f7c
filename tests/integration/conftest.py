"""The integration tier: tests on the real Kafka broker and whole services."""

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in item.nodeid:
            item.add_marker(pytest.mark.integration)
