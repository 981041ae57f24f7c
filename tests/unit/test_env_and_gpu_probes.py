"""The gymnasium wrapper, the NVML sampler (against a test double of pynvml) and the SB3
callback."""

from __future__ import annotations

import gymnasium as gym
import pytest
from nvml_double import NvmlTestDouble
from recording import RecordingTransport, manual_probe

from dsec.ingest.gym_wrapper import EpisodeReporter
from dsec.ingest.nvml import NvmlSampler


class CorridorEnv(gym.Env):
    """Walks right; ends at the wall (terminated, reason in info) or at the time limit."""

    observation_space = gym.spaces.Discrete(100)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, wall_at: int) -> None:
        self._wall_at = wall_at
        self._position = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._position = 0
        return 0, {}

    def step(self, action):
        self._position += 1
        hit = self._position >= self._wall_at
        info = {"why": "hit_wall_east"} if hit else {}
        return self._position, 0.5, hit, False, info


def _run_episodes(env: gym.Env, episodes: int) -> None:
    for _ in range(episodes):
        env.reset()
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(1)
            done = terminated or truncated


def test_wrapper_reports_length_return_and_how_each_episode_ended() -> None:
    transport = RecordingTransport()
    probe = manual_probe(transport)
    walled = EpisodeReporter(CorridorEnv(wall_at=4), sink=probe, reason_key="why")
    _run_episodes(walled, 3)
    limited = EpisodeReporter(gym.wrappers.TimeLimit(CorridorEnv(wall_at=99), 6), sink=probe,
                              reason_fn=lambda obs, _info: f"stopped_at_{obs}")
    _run_episodes(limited, 1)
    probe.flush()
    episodes = transport.samples("episode")
    assert [(e.length, e.reward) for e in episodes] == [(4, 2.0)] * 3 + [(6, 3.0)]
    assert [e.termination_reason for e in episodes] == ["hit_wall_east"] * 3 + ["stopped_at_6"]
    assert [(e.terminated, e.truncated) for e in episodes[-2:]] == [(True, False), (False, True)]
    assert [e.episode_index for e in episodes] == [0, 1, 2, 3]


def test_wrapper_without_dsec_init_warns_once_and_keeps_going() -> None:
    env = EpisodeReporter(CorridorEnv(wall_at=2))
    _run_episodes(env, 2)
    assert env.episodes_reported == 0


def test_nvml_sampler_reads_every_field_and_degrades_per_field() -> None:
    transport = RecordingTransport()
    probe = manual_probe(transport)
    nvml = NvmlTestDouble()
    sampler = NvmlSampler(probe, interval_s=60, nvml=nvml)
    assert sampler.open() and sampler.sample_once() == 2
    sampler.stop()
    assert nvml.shut_down
    probe.flush()
    first, second = transport.samples("gpu")
    assert first.gpu_uuid == "GPU-00000000-aaaa-bbbb" and first.gpu_model == "NVIDIA H200"
    assert (first.memory_used_bytes, first.memory_total_bytes) == (1 << 30, 80 << 30)
    assert (first.utilisation_pct, first.temperature_c, first.sm_clock_mhz) == (87, 71, 1755)
    assert first.throttle_reasons == 0x20 and first.power_w == pytest.approx(412.5)
    assert second.power_w is None and second.memory_used_bytes == 2 << 30


def test_nvml_sampler_selects_gpus_by_index() -> None:
    transport = RecordingTransport()
    sampler = NvmlSampler(manual_probe(transport), 60, gpu_indices=(1, 5), nvml=NvmlTestDouble())
    assert sampler.open() and sampler.sample_once() == 1


def test_host_without_nvml_says_so_once_and_the_thread_ends(caplog) -> None:
    class NoDriver(NvmlTestDouble):
        def nvmlInit(self) -> None:
            raise self.NVMLError("NVML Shared Library Not Found")

    transport = RecordingTransport()
    sampler = NvmlSampler(manual_probe(transport), 0.01, nvml=NoDriver())
    with caplog.at_level("INFO", logger="dsec.ingest.nvml"):
        sampler.start()
        sampler._thread.join(timeout=5)
    assert sampler.available is False and "Not Found" in sampler.unavailable_reason
    assert sum("NVML unavailable" in r.getMessage() for r in caplog.records) == 1
    sampler.stop()
    assert transport.messages == []


def test_sb3_callback_reports_episodes_and_optimizer_steps() -> None:
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from dsec.ingest.sb3 import DsecCallback

    transport = RecordingTransport()
    probe = manual_probe(transport, grad_norm_every_n_steps=1)
    env = make_vec_env("CartPole-v1", n_envs=1, seed=0)
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=256, callback=DsecCallback(probe=probe))
    assert not probe.watching  # the callback unhooks what it hooked
    probe.flush()
    episodes = transport.samples("episode")
    steps = transport.samples("step")
    assert episodes and sum(e.length for e in episodes) <= 256
    assert len(steps) == 4  # 2 rollouts x 1 epoch x 128/64 minibatches
    assert all(s.grad_norm is not None and s.grad_norm > 0 for s in steps)
