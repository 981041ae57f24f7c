"""Episodes without code: every environment ``gymnasium.make`` returns reports its episodes.

Both names are wrapped: ``gymnasium.make`` (what programs call) and
``gymnasium.envs.registration.make`` (what ``make_vec`` and the vector environments call),
so every sub-environment of a vector environment reports too. A loop that steps something
other than a gymnasium environment reports its episode ends with one line:
``dsec.report_episode_end(episode_return, episode_length)``.
"""

from __future__ import annotations

import functools
from typing import Any

from dsec.ingest.gym_wrapper import EpisodeReporter, EpisodeSink


def install_make(gymnasium: Any, sink: EpisodeSink) -> None:
    registration = gymnasium.envs.registration
    original = registration.make
    if getattr(original, "__dsec_sink__", None) is not None:
        return

    @functools.wraps(original)
    def make(*args: Any, **kwargs: Any) -> Any:
        return EpisodeReporter(original(*args, **kwargs), sink=sink)

    make.__dsec_sink__ = sink  # type: ignore[attr-defined]
    registration.make = make
    if gymnasium.make is original:
        gymnasium.make = make
