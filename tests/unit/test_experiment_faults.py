"""Fault scenarios: validated, and a schedule that is a pure function of its inputs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dsec.experiment.faults import Scenario, fault_schedule, load_scenario, ready_scenarios


def test_ready_scenarios_load_and_quiet_has_no_faults() -> None:
    names = ready_scenarios()
    assert {"quiet", "bad-night"} <= set(names)
    for name in names:
        load_scenario(name)
    assert fault_schedule(load_scenario("quiet"), 8, 3600.0) == ()


def test_the_schedule_is_deterministic_and_seeded() -> None:
    scenario = load_scenario("bad-night")
    first = fault_schedule(scenario, 8, 180.0, seed=1)
    assert first == fault_schedule(scenario, 8, 180.0, seed=1)
    assert first != fault_schedule(scenario, 8, 180.0, seed=2)
    assert [e.start_s for e in first] == sorted(e.start_s for e in first)
    assert all(0 <= e.start_s < 180.0 and e.end_s >= e.start_s for e in first)


def test_faults_hit_only_their_targets_and_a_new_worker_moves_no_one_else() -> None:
    scenario = load_scenario("bad-night")
    eight = fault_schedule(scenario, 8, 600.0, seed=0)
    leaks = {e.worker for e in eight if e.kind == "memory_leak"}
    assert leaks <= {0, 3, 5}
    four = fault_schedule(scenario, 4, 600.0, seed=0)
    assert [e for e in eight if e.worker < 4] == list(four)


def test_rates_are_per_simulated_hour() -> None:
    scenario = Scenario.model_validate({
        "name": "t", "sim_hour_s": 10,
        "faults": {"crash": {"rate_per_hour": 2.0, "targets": [0]}}})
    events = fault_schedule(scenario, 1, 10_000.0, seed=3)  # 1,000 simulated hours
    assert len(events) == pytest.approx(2000, rel=0.1)


def test_misspelt_fields_are_rejected(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nfaults:\n  memory_leek: {rate_per_hour: 1}\n")
    with pytest.raises(ValidationError):
        load_scenario(path)
    with pytest.raises(FileNotFoundError, match="ready"):
        load_scenario("no-such-scenario")
