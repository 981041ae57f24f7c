import math

import pytest
import torch

from dsec.actuators.step_guard import NonFiniteStepGuard, grads_finite


def _model_and_grads(value: float) -> torch.nn.Linear:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.1)
    model.bias.grad[0] = value
    return model


def _state_copy(optimizer: torch.optim.Optimizer) -> list[dict]:
    return [{k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
            for s in optimizer.state.values()]


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.Adam(ps, lr=0.1),
    lambda ps: torch.optim.AdamW(ps, lr=0.1),
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
], ids=["adam", "adamw", "sgd-momentum"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_step_leaves_weights_and_moments_as_they_were(make, bad):
    model = _model_and_grads(0.1)
    optimizer = make(list(model.parameters()))
    guard = NonFiniteStepGuard(optimizer)
    optimizer.step()  # a finite step: moments exist from here on
    weights = [p.detach().clone() for p in model.parameters()]
    moments = _state_copy(optimizer)

    model.bias.grad[0] = bad
    optimizer.step()

    assert guard.skipped_steps == 1 and guard.steps == 2
    for before, p in zip(weights, model.parameters(), strict=True):
        assert torch.equal(before, p.detach())
    for before, after in zip(moments, _state_copy(optimizer), strict=True):
        for key, value in before.items():
            assert torch.equal(value, after[key]) if torch.is_tensor(value) else value == after[key]
    # the gradients are given back as they were
    assert model.bias.grad is not None and not math.isfinite(float(model.bias.grad[0]))


def test_finite_steps_go_through_and_the_guard_can_be_removed():
    model = _model_and_grads(0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    guard = NonFiniteStepGuard(optimizer)
    before = model.weight.detach().clone()
    optimizer.step()
    assert guard.skipped_steps == 0
    assert torch.allclose(model.weight.detach(), before - 0.1)

    guard.remove()
    model.bias.grad[0] = math.nan
    optimizer.step()
    assert guard.steps == 1  # no longer hooked
    assert math.isnan(float(model.bias.detach()[0]))


def test_on_skip_is_told_each_skip():
    model = _model_and_grads(math.nan)
    optimizer = torch.optim.Adam(model.parameters())
    seen: list[int] = []
    NonFiniteStepGuard(optimizer, on_skip=seen.append)
    optimizer.step()
    optimizer.step()
    assert seen == [1, 2]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_grads_finite():
    model = _model_and_grads(0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert grads_finite(optimizer)
    model.weight.grad[1, 2] = math.inf
    assert not grads_finite(optimizer)
    for p in model.parameters():
        p.grad = None
    assert grads_finite(optimizer)


def test_sparse_gradients_are_checked_and_stepped():
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    optimizer = torch.optim.SGD(embedding.parameters(), lr=1.0)
    guard = NonFiniteStepGuard(optimizer)
    before = embedding.weight.detach().clone()
    embedding(torch.tensor([1, 2])).sum().backward()
    optimizer.step()
    assert (guard.steps, guard.skipped_steps, guard.unchecked_steps) == (1, 0, 0)
    assert not torch.equal(before, embedding.weight.detach())


def test_gradients_it_cannot_check_do_not_stop_the_step(monkeypatch):
    import dsec.actuators.step_guard as step_guard

    def cannot(_optimizer):
        raise RuntimeError("no norm for these")

    monkeypatch.setattr(step_guard, "grads_finite", cannot)
    model = _model_and_grads(math.nan)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = NonFiniteStepGuard(optimizer)
    optimizer.step()
    assert (guard.steps, guard.skipped_steps, guard.unchecked_steps) == (1, 0, 1)


def test_without_an_optimizer_it_guards_every_optimizer_of_the_process():
    guard = NonFiniteStepGuard()  # torch's global step hooks, as ``dsec run`` installs it
    try:
        first, second = _model_and_grads(math.nan), _model_and_grads(0.1)
        for model in (first, second):
            torch.optim.Adam(model.parameters(), lr=0.1).step()
        assert (guard.steps, guard.skipped_steps) == (2, 1)
        assert all(torch.isfinite(p).all() for p in first.parameters())
    finally:
        guard.remove()


def test_dsec_run_installs_it_when_asked():
    from dsec.zerotouch.session import ZeroTouch

    session = ZeroTouch(env={"DSEC_RUN_SKIP_NONFINITE_STEPS": "1"})
    session._guard_steps()
    try:
        model = _model_and_grads(math.inf)
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        assert session.step_guard.skipped_steps == 1
        assert all(torch.isfinite(p).all() for p in model.parameters())
    finally:
        session.step_guard.remove()
    unasked = ZeroTouch(env={})
    unasked._guard_steps()
    assert unasked.step_guard is None
