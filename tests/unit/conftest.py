"""The unit tier: no broker, no subprocess services; ``make test-fast`` runs it alone."""

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/unit/" in item.nodeid and "kafka_bootstrap" in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(f"{item.nodeid} needs the broker: move it to tests/integration")


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    """The unit tier's models are tiny: one intra-op thread computes them as fast, and does
    not spin against the other processes of a shared machine (torch's default of one
    thread per core slows such a test tenfold when the cores are busy)."""
    import torch

    torch.set_num_threads(1)
