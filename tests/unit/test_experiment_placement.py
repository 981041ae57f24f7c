"""Placement in the experiment: on a fleet where one simulated GPU model leaks on long
episodes, the restarter that asks the recommendation API (over HTTP) puts restarted
workers on the other model, and fewer of them die again than when they come back on
their own card (same seeds)."""

from __future__ import annotations

from dsec.experiment.placement_run import PlacementScenario, run_placement_arms


def test_restarted_workers_avoid_the_leaky_model_and_interruptions_drop() -> None:
    (result,) = run_placement_arms(PlacementScenario(), [1])
    without, placed = result["without"], result["with"]
    assert without["interruptions"] >= 2
    assert without["restarts_on_leaky_model"] == without["restarts"]
    assert placed["restarts"] >= 1  # the first OOMs come before any history
    assert placed["restarts_on_leaky_model"] == 0
    assert placed["interruptions"] < without["interruptions"]
    assert placed["productive_steps"] > without["productive_steps"]


def test_the_arms_are_deterministic_per_seed() -> None:
    scenario = PlacementScenario(steps=2000)
    assert run_placement_arms(scenario, [4]) == run_placement_arms(scenario, [4])
