"""The goodput experiment's fleet: its layout, where workers start, the card a restarted
worker gets, and the restarter asking the real recommendation API over HTTP."""

from __future__ import annotations

import subprocess

import pytest
from pydantic import ValidationError

from dsec.experiment.arms import arms_of
from dsec.experiment.faults import Scenario, load_scenario
from dsec.experiment.fleet import (
    WORKLOAD,
    Card,
    Fleet,
    card_uuid,
    choose_card,
    first_cards,
    fleet_layout,
    leak_of,
)
from dsec.experiment.recommend_api import RecommendationServer
from dsec.experiment.report import placement_rows
from dsec.experiment.runner import GoodputOptions, _placed_card, _placement_summary, _Slot
from dsec.placement.api import HistorySource
from dsec.placement.history import history_from_events
from dsec.schemas.placement import (
    GpuPersonalityEvent,
    GpuTopologyEvent,
    RegimeStats,
    WorkloadAffinityEvent,
)

T0_MS = 1_800_000_000_000
FLEET = Fleet.model_validate({"models": [
    {"name": "SimGPU-A", "cards": 3, "leak": {"long_episode_steps": 30,
                                              "bytes_per_step": 1 << 23, "live_share": 1.0}},
    {"name": "SimGPU-B", "cards": 2}]})


def test_the_layout_takes_one_card_of_each_model_in_turn() -> None:
    layout = fleet_layout(FLEET, "dsec")
    assert [(c.uuid, c.model) for c in layout] == [
        ("GPU-sim-dsec-SimGPU-A-0", "SimGPU-A"), ("GPU-sim-dsec-SimGPU-B-0", "SimGPU-B"),
        ("GPU-sim-dsec-SimGPU-A-1", "SimGPU-A"), ("GPU-sim-dsec-SimGPU-B-1", "SimGPU-B"),
        ("GPU-sim-dsec-SimGPU-A-2", "SimGPU-A")]
    # Every arm gets cards of its own, in the same places.
    assert [c.model for c in fleet_layout(FLEET, "plain")] == [c.model for c in layout]
    assert first_cards(layout, 2) == layout[:2]
    with pytest.raises(ValueError, match="6 workers for a fleet of 5 cards"):
        first_cards(layout, 6)


def test_a_restarted_worker_gets_the_best_free_card_or_its_own() -> None:
    ranked = ["b0", "b1", "a0", "a1"]
    assert choose_card(ranked, busy={"b0"}, own="a1") == "b1"
    assert choose_card(ranked, busy={"b0", "b1", "a0"}, own="a1") == "a1"
    assert choose_card([], busy=set(), own="a1") == "a1"


def test_the_leaky_model_is_the_scenarios_and_the_plan_carries_it() -> None:
    scenario = load_scenario("leaky-model")
    assert scenario.fleet is not None
    plan = scenario.model_dump(mode="json")
    leaky = [m.name for m in scenario.fleet.models if m.leak is not None]
    assert len(leaky) == 1
    assert leak_of(plan["fleet"], leaky[0])["live_share"] == 1.0
    assert leak_of(plan["fleet"], "SimGPU-B") is None
    assert leak_of(None, leaky[0]) is None
    cards = sum(m.cards for m in scenario.fleet.models)
    assert cards > 4  # free cards beside the 4 workers of the measured runs
    assert Scenario.model_validate({"name": "t"}).fleet is None
    with pytest.raises(ValidationError):
        Fleet.model_validate({"models": [{"name": "bad name", "cards": 1}]})


def test_a_subset_of_arms_is_checked_and_results_name_theirs() -> None:
    assert GoodputOptions(arms=("dsec",)).arms == ("dsec",)
    with pytest.raises(ValueError, match="arms must be among"):
        GoodputOptions(arms=("dsec", "best"))
    with pytest.raises(ValueError, match="arms must be among"):
        GoodputOptions(arms=())
    assert arms_of({"dsec": {}, "run": {}, "plain": {}}) == ["plain", "dsec"]


def _personality(uuid: str, model: str, leak_bytes_per_s: float, score: float,
                 scope: str = "gpu") -> GpuPersonalityEvent:
    stats = RegimeStats(leak_bytes_per_s=leak_bytes_per_s, leak_observed_s=30.0,
                        observed_s=30.0, workers=1, feature_events=10)
    return GpuPersonalityEvent(event_time_ms=T0_MS, scope=scope, gpu_uuid=uuid,
                               gpu_model=model, regimes={"all": stats},
                               stability_score={"all": score}, first_seen_ms=T0_MS,
                               last_seen_ms=T0_MS)


def _slot(index: int, card: Card) -> _Slot:
    process = subprocess.Popen(["true"])
    process.wait()
    return _Slot("dsec", index, process, card=card)


def test_the_restarter_asks_the_api_and_takes_the_best_free_card() -> None:
    layout = fleet_layout(FLEET, "dsec")
    a0, b0 = card_uuid("dsec", "SimGPU-A", 0), card_uuid("dsec", "SimGPU-B", 0)
    events = [GpuTopologyEvent(event_time_ms=T0_MS, node_id=f"node-{c.uuid}",
                               gpu_uuid=c.uuid, gpu_model=c.model, gpu_index=0)
              for c in layout]
    events += [_personality(a0, "SimGPU-A", 50e6, 0.02),
               _personality("", "SimGPU-A", 50e6, 0.02, scope="model"),
               _personality(b0, "SimGPU-B", 0.0, 1.0),
               _personality("", "SimGPU-B", 0.0, 1.0, scope="model"),
               WorkloadAffinityEvent(event_time_ms=T0_MS, workload=WORKLOAD,
                                     gpu_model="SimGPU-A", ooms=1, observed_s=30.0,
                                     first_seen_ms=T0_MS, last_seen_ms=T0_MS)]
    slots = [_slot(0, layout[0]), _slot(1, layout[1])]  # on A-0 (it OOMed) and B-0
    source = HistorySource(lambda: history_from_events(events), refresh_s=0.0)
    with RecommendationServer(source, clock_ms=lambda: T0_MS) as api:
        card, asked = _placed_card(api, slots[0], slots, layout)
    assert card == Card(card_uuid("dsec", "SimGPU-B", 1), "SimGPU-B")  # B-0 is taken
    assert asked["error"] is None and asked["ranked"][0] == b0
    moves = [{"from": a0, "to": card.uuid, "to_model": card.model},
             {"from": a0, "to": a0, "to_model": "SimGPU-A"}]
    summary = _placement_summary(moves, {"SimGPU-A"})
    assert (summary["restarts"], summary["restarts_on_leaky_model"], summary["moved"]) == (
        2, 1, 1)


def test_without_an_answer_the_worker_goes_back_to_its_own_card() -> None:
    layout = fleet_layout(FLEET, "dsec")
    slots = [_slot(0, layout[0])]

    def unreadable():
        raise RuntimeError("store down")

    with RecommendationServer(HistorySource(unreadable, refresh_s=0.0)) as api:
        card, asked = _placed_card(api, slots[0], slots, layout)
    assert card == layout[0]
    assert "503" in asked["error"]


def test_the_closing_note_sets_runs_without_and_with_placement_side_by_side() -> None:
    def run(seed: int, interruptions: int, restarts: int, leaky: int) -> dict:
        return {"run": {"seed": seed}, "dsec": {
            "interruptions": interruptions,
            "placement": {"restarts": restarts, "restarts_on_leaky_model": leaky}}}

    rows = placement_rows([run(1, 6, 6, 4), run(2, 5, 5, 3)],
                          [run(1, 2, 2, 0), run(2, 2, 2, 0)], ("dsec",))
    assert rows == [
        {"seed": 1, "arm": "dsec", "interruptions_off": 6, "interruptions_on": 2,
         "restarts_off": 6, "restarts_on": 2, "restarts_on_leaky_model_off": 4,
         "restarts_on_leaky_model_on": 0},
        {"seed": 2, "arm": "dsec", "interruptions_off": 5, "interruptions_on": 2,
         "restarts_off": 5, "restarts_on": 2, "restarts_on_leaky_model_off": 3,
         "restarts_on_leaky_model_on": 0}]


def test_the_cli_refuses_unknown_arms_and_placement_settings_before_starting() -> None:
    from typer.testing import CliRunner

    from dsec.cli import app

    for option, value, said in (("--arms", "dsec,best", "arms must be among"),
                                ("--placement", "sideways", "must be on, off or both")):
        result = CliRunner().invoke(app, ["experiment", "goodput", "--scenario",
                                          "leaky-model", option, value])
        assert result.exit_code == 2
        assert said in result.output


def test_both_placement_settings_get_a_report_each(tmp_path) -> None:
    from dsec.cli.experiment import _write_placement_reports

    def run(interruptions: int) -> dict:
        return {"run": {"seed": 1, "scenario": "leaky-model", "workers": 2, "duration_s": 60.0},
                "dsec": {"interruptions": interruptions, "return_curve": [1.0, None, 3.0],
                         "deaths": [{"worker": 0, "t": 5.0, "cause": "oom"}]}}

    _write_placement_reports(tmp_path / "goodput.html", {False: [run(6)], True: [run(2)]},
                             as_json=True)
    off = (tmp_path / "goodput-placement-off.html").read_text()
    on = (tmp_path / "goodput-placement-on.html").read_text()
    assert "<svg" in off and "<td>interruptions</td><td>6</td>" in off
    assert "<td>interruptions</td><td>2</td>" in on
