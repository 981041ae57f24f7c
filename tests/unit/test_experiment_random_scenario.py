"""Generated scenarios: valid, seeded, and drawn from the stated distributions."""

from __future__ import annotations

from dsec.experiment.faults import fault_schedule
from dsec.experiment.random_scenario import DRAWN_KINDS, random_scenario


def test_a_seed_gives_one_scenario_and_seeds_differ() -> None:
    assert random_scenario(3) == random_scenario(3)
    assert random_scenario(3) != random_scenario(4)
    assert random_scenario(3).name == "random-3"


def test_draws_stay_inside_the_stated_ranges() -> None:
    for seed in range(40):
        scenario = random_scenario(seed)
        faults = scenario.faults
        drawn = [k for k in DRAWN_KINDS if getattr(faults, k).rate_per_hour > 0]
        assert 3 <= len(drawn) <= 6
        assert faults.crash.rate_per_hour > 0
        for kind in drawn:
            fault = getattr(faults, kind)
            assert 0.1 <= fault.rate_per_hour <= 0.6
            assert 1 <= len(fault.targets) <= 3 and all(0 <= t < 8 for t in fault.targets)
            if hasattr(fault, "duration_h") and kind not in ("crash",):
                assert 0.5 <= fault.duration_h <= 4.0
        assert faults.nan_burst.precursor_s in (0.0, 8.0)
        assert 2.0 <= faults.straggler.slowdown <= 4.0 or faults.straggler.rate_per_hour == 0
        # the onsets then come from the ordinary schedule, the same for every arm
        assert fault_schedule(scenario, 8, 150.0, seed) == fault_schedule(scenario, 8, 150.0,
                                                                           seed)


def test_every_kind_is_drawn_over_a_few_seeds() -> None:
    seen = set()
    for seed in range(20):
        faults = random_scenario(seed).faults
        seen |= {k for k in DRAWN_KINDS if getattr(faults, k).rate_per_hour > 0}
    assert seen == set(DRAWN_KINDS)
