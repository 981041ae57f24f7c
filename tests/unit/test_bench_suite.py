"""``dsec bench all``: its parts' command lines and how their output is gathered."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from dsec.bench.suite import PARTS, SuiteOptions, last_json_object, part_arguments
from dsec.cli import app


def _parse(arguments: list[str]) -> Any:
    """Resolves and parses a ``dsec`` command line without running it (a misspelt option
    or a value out of range raises)."""
    command = typer.main.get_command(app)
    name = "dsec"
    while hasattr(command, "commands"):  # a group
        name, arguments = arguments[0], arguments[1:]
        command = command.commands[name]
    return command.make_context(name, list(arguments))


@pytest.mark.parametrize("part", PARTS)
def test_every_part_is_a_valid_dsec_command_printing_json(part: str) -> None:
    options = SuiteOptions(probe_block_pairs=3, pipeline_samples=20_000, reaction_trials=2,
                           goodput_duration_s=12.0)
    context = _parse(part_arguments(part, options, "127.0.0.1:9092"))
    assert context.params["as_json"] is True


def test_the_short_settings_reach_their_parts() -> None:
    options = SuiteOptions(reaction_trials=4, goodput_workers=3)
    assert _parse(part_arguments("reaction", options, "b:1")).params["trials"] == 4
    goodput = _parse(part_arguments("goodput", options, "b:1")).params
    assert (goodput["workers"], goodput["scenario"], goodput["bootstrap"]) == (3, "smoke", "b:1")


def test_unknown_parts_are_refused() -> None:
    with pytest.raises(ValueError, match="parts must be among"):
        SuiteOptions(parts=("pipeline", "warp-drive"))
    with pytest.raises(ValueError):
        SuiteOptions(parts=())


def test_the_last_json_object_of_an_output_is_taken() -> None:
    output = 'starting\n{"a": 1}\nlog line\n{"b": 2}\n{not json\n[1, 2]\n'
    assert last_json_object(output) == {"b": 2}
    assert last_json_object("no figures\n") is None


def test_the_compression_part_runs_its_short_setting() -> None:
    options = SuiteOptions(compression_steps=2)
    assert _parse(part_arguments("compression", options, "b:1")).params["steps"] == 2
