"""The experiment's fleet of simulated cards: GPU models, how many cards of each, and which
model leaks on long episodes; where workers start and where a restarted one goes.

Pure functions: the layout is the same for every arm and every placement setting, so
runs with and without placement start from the same cards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["WORKLOAD", "Card", "CardModel", "Fleet", "ModelLeak", "card_uuid", "choose_card",
           "first_cards", "fleet_layout", "leak_of"]

# The workload class the experiment's workers declare (their ``workload`` label): what
# their history is kept under and what the restarter asks placement for.
WORKLOAD = "ppo-cartpole"


class ModelLeak(BaseModel):
    """Every card of the model loses ``bytes_per_step`` per environment step of each
    episode at least ``long_episode_steps`` long, for as long as a worker runs on it.
    ``live_share`` of it is memory the process cannot give back (a memory cap does not
    reclaim it); the rest is fragmented blocks."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    long_episode_steps: int = Field(default=150, ge=1)
    bytes_per_step: int = Field(default=4 << 20, ge=0)
    live_share: float = Field(default=0.0, ge=0.0, le=1.0)


class CardModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    cards: int = Field(ge=1, le=256)
    leak: ModelLeak | None = None


class Fleet(BaseModel):
    """The cards of each arm. More cards than workers leaves free ones to restart on."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    models: list[CardModel] = Field(min_length=1, max_length=16)

    def model(self, name: str) -> CardModel | None:
        return next((m for m in self.models if m.name == name), None)


@dataclass(frozen=True)
class Card:
    uuid: str
    model: str


def card_uuid(arm: str, model: str, index: int) -> str:
    return f"GPU-sim-{arm}-{model}-{index}"


def fleet_layout(fleet: Fleet, arm: str) -> list[Card]:
    """The arm's cards in the order a scheduler without history fills them: one of each
    model in turn, so the first workers land on every model."""
    layout: list[Card] = []
    for index in range(max(m.cards for m in fleet.models)):
        layout += [Card(card_uuid(arm, m.name, index), m.name)
                   for m in fleet.models if index < m.cards]
    return layout


def first_cards(layout: list[Card], workers: int) -> list[Card]:
    """Slot ``i`` starts on ``layout[i]``."""
    if workers > len(layout):
        raise ValueError(f"{workers} workers for a fleet of {len(layout)} cards")
    return layout[:workers]


def choose_card(ranked: Iterable[str], busy: set[str], own: str) -> str:
    """The best-ranked card no other worker holds; the worker's own card when none is."""
    return next((uuid for uuid in ranked if uuid not in busy), own)


def leak_of(fleet: Mapping | None, model: str) -> dict | None:
    """The leak of ``model`` in a plan's fleet (its JSON form), or None."""
    if not fleet:
        return None
    for entry in fleet["models"]:
        if entry["name"] == model:
            return entry.get("leak")
    return None
