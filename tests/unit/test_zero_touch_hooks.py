"""The instrumentations of ``dsec run``, each on real torch, gymnasium and DDP. Each is
installed on a subclass or a stand-in module here, so the test process keeps torch's own."""

from __future__ import annotations

import logging
import sys
import textwrap
from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dsec.actuators.restore import restore
from dsec.actuators.snapshotter import SnapshotConfig, Snapshotter
from dsec.ingest.grad_sync import GradSyncTimer
from dsec.schemas.actuations import PrecisionParams
from dsec.zerotouch.autocast import AutocastOverride
from dsec.zerotouch.ddp import DdpHooks
from dsec.zerotouch.gym import install_make
from dsec.zerotouch.import_hooks import PostImportFinder
from dsec.zerotouch.log_once import OncePerMessage
from dsec.zerotouch.losses import install_clip_hook, install_loss_hook
from dsec.zerotouch.optimizers import OptimizerParams, OptimizerRegistry, Optimizers


@pytest.fixture
def finder():
    finder = PostImportFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)


def test_a_post_import_hook_runs_once_the_module_ran_and_leaves_its_loader(
        finder, tmp_path, monkeypatch) -> None:
    (tmp_path / "zt_plain_module.py").write_text("VALUE = 41\n")
    (tmp_path / "zt_failing_hook.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder.when_imported("zt_plain_module", lambda module: seen.append(module.VALUE + 1))
    finder.when_imported("zt_failing_hook", lambda module: 1 / 0)
    import zt_failing_hook  # a hook that raises does not fail the import
    import zt_plain_module

    assert seen == [42] and zt_failing_hook.VALUE == 1
    assert type(zt_plain_module.__loader__).__name__ == "SourceFileLoader"
    assert zt_plain_module.__spec__.loader is zt_plain_module.__loader__
    finder.when_imported("zt_plain_module", lambda module: seen.append(0))  # already there
    assert seen == [42, 0]
    for name in ("zt_plain_module", "zt_failing_hook"):
        monkeypatch.delitem(sys.modules, name)


def test_every_optimizer_built_is_remembered_in_order() -> None:
    registry = OptimizerRegistry()

    class Sgd(torch.optim.SGD):
        pass

    registry.install(Sgd)
    registry.install(Sgd)  # twice: wrapped once
    first = Sgd([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    second = Sgd([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    assert registry.live() == [first, second]
    del first
    assert registry.live() == [second]  # weakly: a dropped optimizer is forgotten


def test_a_snapshot_through_two_optimizers_restores_their_parameters_and_state(tmp_path) -> None:
    torch.manual_seed(0)
    actor, critic = torch.nn.Linear(4, 2), torch.nn.Linear(4, 1)
    optimizers = [torch.optim.Adam(actor.parameters(), lr=1e-2),
                  torch.optim.SGD(critic.parameters(), lr=1e-2, momentum=0.9)]
    for _ in range(3):
        x = torch.randn(8, 4)
        (actor(x).pow(2).mean() + critic(x).pow(2).mean()).backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    snapshotter = Snapshotter(OptimizerParams(optimizers), Optimizers(optimizers),
                              SnapshotConfig(directory=tmp_path))
    assert snapshotter.request(3) == 0 and snapshotter.wait_idle(30)
    snapshotter.close()
    saved = [p.detach().clone() for o in optimizers for g in o.param_groups for p in g["params"]]
    saved_moment = optimizers[0].state[actor.weight]["exp_avg"].clone()
    with torch.no_grad():
        for parameter in [*actor.parameters(), *critic.parameters()]:
            parameter.zero_()
    fresh = [torch.optim.Adam(actor.parameters(), lr=1e-2),
             torch.optim.SGD(critic.parameters(), lr=1e-2, momentum=0.9)]
    restore(tmp_path, OptimizerParams(fresh), Optimizers(fresh), restore_rng=False)
    now = [p for o in fresh for g in o.param_groups for p in g["params"]]
    assert all(torch.equal(a, b) for a, b in zip(saved, now, strict=True))
    assert torch.equal(fresh[0].state[actor.weight]["exp_avg"], saved_moment)
    assert "momentum_buffer" in fresh[1].state[critic.weight]


def test_autocast_regions_follow_the_commanded_dtype_and_a_disabled_one_stays_off() -> None:
    override = AutocastOverride()

    class Region(torch.autocast):
        pass

    override.install(Region)
    without = override.apply(PrecisionParams(dtype="fp32"))
    assert without.status == "unsupported" and "dsec.autocast()" in without.detail
    linear = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with Region("cpu", dtype=torch.bfloat16):
        assert linear(x).dtype == torch.bfloat16  # as the program asks
    pending = override.apply(PrecisionParams(dtype="fp32"))
    assert pending.settle() is None  # no region has run under it yet
    with Region("cpu", dtype=torch.bfloat16):
        assert linear(x).dtype == torch.float32
        with Region("cpu", enabled=False):
            assert linear(x).dtype == torch.float32
    effect = pending.settle()  # read back from the region that ran under it
    assert (effect.status, effect.requested, effect.in_force) == ("applied", "fp32", "fp32")
    assert "cpu bfloat16" in effect.detail
    assert override.apply(PrecisionParams(dtype="fp16")).status == "unsupported"  # scaling
    override.apply(PrecisionParams(dtype="bf16"))
    with Region("cpu", dtype=torch.bfloat16), Region("cpu", enabled=False):
        assert linear(x).dtype == torch.float32  # the program's own fp32 part


def test_the_loss_is_the_scalar_backward_runs_on_and_the_clipping_norm_is_reused() -> None:
    losses, norms = [], []

    class Loss(torch.Tensor):
        pass

    install_loss_hook(Loss, losses.append)
    weight = torch.nn.Parameter(torch.ones(3))
    loss = (weight * 2).sum().as_subclass(Loss)
    loss.backward()
    (weight * 2).as_subclass(Loss).backward(torch.ones(3))  # not a scalar: no loss
    assert len(losses) == 1 and losses[0] is loss and weight.grad.sum().item() == 12.0

    utils = SimpleNamespace(clip_grad_norm_=torch.nn.utils.clip_grad_norm_)
    utils.clip_grad = SimpleNamespace(clip_grad_norm_=utils.clip_grad_norm_)
    install_clip_hook(utils, norms.append)
    total = utils.clip_grad.clip_grad_norm_([weight], 1.0)
    utils.clip_grad_norm_([weight], 1.0, float("inf"))  # not an L2 norm: not reused
    assert norms == [total]


def test_every_ddp_model_gets_a_timed_hook_and_a_program_hook_takes_the_all_reduces_place(
        tmp_path) -> None:
    syncs: list[tuple] = []
    sink = SimpleNamespace(global_step=0, record_grad_sync=lambda *a, **k: syncs.append(a))
    hooks = DdpHooks(GradSyncTimer(sink))

    class Ddp(DistributedDataParallel):
        pass

    hooks.install(Ddp)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        model = Ddp(torch.nn.Linear(8, 8))
        model(torch.randn(4, 8)).sum().backward()
        assert [s[4] for s in syncs] == ["ddp_bucket_all_reduce"] and syncs[0][1] > 0
        calls = []

        def own_hook(state, bucket):
            calls.append(state)
            return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(
                lambda done: done.value()[0])

        model.register_comm_hook("mine", own_hook)  # DDP takes one: no error here
        model(torch.randn(4, 8)).sum().backward()
        assert calls == ["mine"] and len(syncs) == 2  # the program's hook, still timed
    finally:
        dist.destroy_process_group()


def test_gym_make_environments_report_their_episodes() -> None:
    episodes = []
    sink = SimpleNamespace(record_episode=lambda reward, length, **kw: episodes.append(length))
    registration = SimpleNamespace(make=gym.envs.registration.make)
    stand_in = SimpleNamespace(make=registration.make, envs=SimpleNamespace(
        registration=registration))
    install_make(stand_in, sink)
    env = stand_in.make("CartPole-v1")
    env.reset(seed=0)
    done, steps = False, 0
    while not done:
        _, _, terminated, truncated, _ = env.step(0)
        steps += 1
        done = terminated or truncated
    assert episodes == [steps] and registration.make is stand_in.make


def test_a_repeated_dsec_message_is_said_once_and_others_pass(caplog) -> None:
    logger = logging.getLogger("dsec.test-once")
    handler = OncePerMessage()
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with caplog.at_level(logging.WARNING):
            for count in (3, 4, 5):
                logger.warning("dsec: %d samples lost", count)
            logger.warning("dsec: something else")
            kafka = logging.getLogger("dsec.kafka")
            kafka.addHandler(handler)
            kafka.propagate = False
            for client in ("producer-1", "producer-1", "consumer-2"):
                kafka.error("%s [%s] %s", "FAIL", client, "refused")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logging.getLogger("dsec.kafka").removeHandler(handler)
        logging.getLogger("dsec.kafka").propagate = True
    assert [r.getMessage() for r in caplog.records] == [
        "dsec: 3 samples lost", "dsec: something else", "FAIL [producer-1] refused",
        "FAIL [consumer-2] refused"]


def test_the_bootstrap_module_text_never_imports_torch_at_start() -> None:
    from dsec.zerotouch.launch import BOOTSTRAP_DIR

    text = (BOOTSTRAP_DIR / "sitecustomize.py").read_text()
    assert "import torch" not in textwrap.dedent(text)
