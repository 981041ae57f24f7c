"""The deploy tier: Helm chart, Compose file, Dockerfile and the packaged services."""

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/deploy/" in item.nodeid:
            item.add_marker(pytest.mark.deploy)
