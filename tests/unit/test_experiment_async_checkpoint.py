"""The strong arm's asynchronous checkpoint: staged at the call, written in the background."""

from __future__ import annotations

import torch

from dsec.experiment.arms import ARM_CONFIGS, ARMS
from dsec.experiment.async_checkpoint import AsyncCheckpointer, load_checkpoint


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_checkpoint_holds_the_state_as_staged_not_as_trained_on(tmp_path) -> None:
    written: list[int] = []
    now = [0.0]
    checkpointer = AsyncCheckpointer(tmp_path / "w.pt", interval_s=5.0,
                                     on_written=written.append, clock=lambda: now[0])
    model, optimizer = _model_and_optimizer()
    assert not checkpointer.due()
    now[0] = 5.0
    assert checkpointer.due()
    staged = {k: v.clone() for k, v in model.state_dict().items()}
    assert checkpointer.save(model, optimizer, updates=7)
    with torch.no_grad():  # training goes on while the write runs
        model.weight.add_(1.0)
    checkpointer.wait(10.0)
    state = load_checkpoint(tmp_path / "w.pt")
    assert state is not None and state["updates"] == 7 and written == [7]
    assert torch.equal(state["model"]["weight"], staged["weight"])
    assert "state" in state["optimizer"]
    assert not checkpointer.due()  # the interval runs from the staging
    assert not (tmp_path / "w.tmp").exists()


def test_no_checkpoint_is_none(tmp_path) -> None:
    assert load_checkpoint(tmp_path / "absent.pt") is None


def test_three_arms_differ_only_where_stated() -> None:
    assert ARMS == ("plain", "strong", "dsec")
    plain, strong, acting = (ARM_CONFIGS[a] for a in ARMS)
    assert plain.dry_run and strong.dry_run and not acting.dry_run
    assert not plain.elastic and strong.elastic and acting.elastic
    assert strong.async_checkpoints and not acting.async_checkpoints
    assert acting.dsec_snapshots and not strong.dsec_snapshots
