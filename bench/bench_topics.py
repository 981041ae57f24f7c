"""A bench run's own topics: a work folder, a broker (the one given, else a local one
started in that folder), settings with a fresh topic prefix and its topics made; the
folder and a started broker gone afterwards."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dsec.infra.kafka_local import LocalKafka
from dsec.infra.topics import ensure_topics
from dsec.schemas.settings import DsecSettings

__all__ = ["bench_topics"]


@contextmanager
def bench_topics(name: str, prefix: str, partitions: int,
                 bootstrap: str | None = None) -> Iterator[tuple[Path, DsecSettings]]:
    """The work folder and the settings (``data_dir`` made in the folder, topics named
    ``prefix`` and a random suffix, ``partitions`` each)."""
    work = Path(tempfile.mkdtemp(prefix=f"dsec-bench-{name}-"))
    kafka = None if bootstrap else LocalKafka(data_dir=work / "kafka")
    try:
        if kafka is not None:
            bootstrap = kafka.start()
        settings = DsecSettings(bootstrap=bootstrap, data_dir=work / "data",
                                topic_prefix=f"{prefix}{uuid.uuid4().hex[:8]}")
        settings.data_dir.mkdir(parents=True)
        ensure_topics(settings, partitions=partitions)
        yield work, settings
    finally:
        if kafka is not None:
            kafka.stop()
        shutil.rmtree(work, ignore_errors=True)
