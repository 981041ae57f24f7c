"""The framework integrations on the real frameworks (CPU, tiny models built from configs,
nothing downloaded) and the real broker: what each publishes through dsec.

veRL is not in the test venv (it needs tensordict, pyvers and omegaconf besides): its test
runs where ``verl.utils.tracking`` imports and is skipped elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter

import pytest
from test_probe_end_to_end import consume_batches

import dsec
from dsec.infra.topics import ensure_topics
from dsec.ingest import ProbeConfig
from dsec.schemas import MetricBatch, topic_names
from dsec.schemas.actuations import PrecisionParams, SnapshotParams

pytestmark = pytest.mark.integration


def _run_worker(settings, worker_id: str, train) -> list:
    """Trains with a probe on the test's broker; returns every sample it published."""
    ensure_topics(settings)
    runtime = dsec.init(worker_id=worker_id, node_id="node-f", settings=settings,
                        probe_config=ProbeConfig(heartbeat_interval_s=0.5,
                                                 step_sample_every_n_steps=1,
                                                 grad_norm_every_n_steps=1))
    try:
        train(runtime)
    finally:
        counters = dsec.shutdown()
    assert counters.samples_dropped == 0

    def received(batches: list[MetricBatch]) -> int:
        return sum(len(b.rows()) for b in batches if b.identity.worker_id == worker_id)

    batches = consume_batches(settings.bootstrap, topic_names(settings.topic_prefix).metrics,
                              lambda got: received(got) >= counters.samples_sent, 60)
    return [s for b in batches if b.identity.worker_id == worker_id for s in b.rows()]


def _char_tokenizer():
    """A character-level tokenizer built here: nothing to download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2,
             **{c: i + 3 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ")}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>",
                                   eos_token="<eos>", unk_token="<unk>")


def test_a_trl_grpo_trainer_publishes_steps_rewards_and_saves_on_a_snapshot(
        settings, tmp_path) -> None:
    import torch
    from datasets import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    outcomes = {}

    class CommandsMidRun(TrainerCallback):
        """Applies a snapshot and a precision command as the actuator would, at step 2's
        boundary, and settles the snapshot at step 3's."""

        def on_step_begin(self, args, state, control, **kwargs) -> None:
            hooks = dsec.current().hooks
            if state.global_step == 1:
                outcomes["snapshot"] = hooks.try_apply(SnapshotParams(), "snap-1")
                outcomes["precision"] = hooks.try_apply(PrecisionParams(dtype="bf16"), "p-1")
            elif state.global_step == 2:
                outcomes["settled"] = hooks.settle()

    def train(_runtime) -> None:
        torch.manual_seed(0)
        tokenizer = _char_tokenizer()
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=64,
                                           n_embd=32, n_layer=1, n_head=2, eos_token_id=1,
                                           pad_token_id=0))
        callback = dsec.trainer_callback()
        trainer = GRPOTrainer(
            model=model, processing_class=tokenizer,
            reward_funcs=lambda completions, **_: [float(len(set(c))) for c in completions],
            train_dataset=Dataset.from_dict({"prompt": ["ab", "cd", "ef", "gh"] * 4}),
            args=GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4,
                            num_generations=4, max_completion_length=6, max_steps=3,
                            logging_steps=1, report_to="none", use_cpu=True,
                            save_strategy="no", learning_rate=1e-3),
            callbacks=[callback, CommandsMidRun()])
        trainer.train()
        outcomes["saved"] = callback.saved

    samples = _run_worker(settings, f"trl-{uuid.uuid4().hex[:6]}", train)
    kinds = Counter(s.kind for s in samples)
    logged = [s for s in samples if s.kind == "step" and s.grad_norm_source == "trainer"]
    assert [s.step for s in logged] == [1, 2, 3]  # one per training log
    assert all(s.loss is not None and s.grad_norm is not None and s.step_time_ms > 0
               for s in logged)
    probed = [s for s in samples if s.kind == "step" and s.grad_norm_source == "probe"]
    assert len(probed) == 3 and all(s.grad_norm >= 0 for s in probed)  # each optimizer step
    episodes = [s for s in samples if s.kind == "episode"]
    assert len(episodes) == 3 and all(e.reward > 0 and e.length > 0 for e in episodes)
    assert kinds["heartbeat"] >= 1
    checkpoint = str(tmp_path / "grpo" / "checkpoint-2")
    assert outcomes["snapshot"] is None  # pending: applied once the trainer has saved
    [settled] = outcomes["settled"]
    assert (settled.actuation_id, settled.effect.status) == ("snap-1", "applied")
    assert settled.effect.detail == f"checkpoint through the Trainer's save path: {checkpoint}"
    assert outcomes["saved"] == [checkpoint]
    assert (tmp_path / "grpo" / "checkpoint-2" / "optimizer.pt").exists()
    assert outcomes["precision"].status == "unsupported"
    assert "accelerator" in outcomes["precision"].detail


def test_an_rllib_ppo_run_publishes_its_episodes_and_iterations(settings) -> None:
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig

    from dsec.ingest.integrations.rllib import DsecRLlibCallback

    def train(_runtime) -> None:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        try:
            algorithm = (PPOConfig().environment("CartPole-v1")
                         .env_runners(num_env_runners=0)
                         .training(train_batch_size=128, minibatch_size=64, num_epochs=1)
                         .callbacks(DsecRLlibCallback)).build_algo()
            for _ in range(2):
                algorithm.train()
            algorithm.stop()
        finally:
            ray.shutdown()

    samples = _run_worker(settings, f"rllib-{uuid.uuid4().hex[:6]}", train)
    episodes = [s for s in samples if s.kind == "episode"]
    assert sum(e.length for e in episodes) >= 128 - 64  # the runs' finished episodes
    assert all(e.reward == e.length and e.terminated != e.truncated for e in episodes)
    iterations = [s for s in samples if s.kind == "step" and s.step_time_ms]
    assert [s.step for s in iterations] == [1, 2]
    assert all(s.loss is not None for s in iterations)


def test_a_verl_tracking_backend_publishes_verls_metrics(settings) -> None:
    tracking = pytest.importorskip("verl.utils.tracking")
    from dsec.ingest.integrations.verl import DsecTracking, attach

    def train(_runtime) -> None:
        run = tracking.Tracking("dsec-test", "tiny", default_backend="console")
        backend = attach(run)
        assert attach(run) is backend and isinstance(run.logger["dsec"], DsecTracking)
        for step in (1, 2):
            run.log({"actor/pg_loss": 0.5 / step, "actor/grad_norm": 2.0 / step,
                     "critic/score/mean": 0.25 * step, "response_length/mean": 96.0 + step,
                     "timing_s/step": 3.5, "perf/throughput": 1000.0}, step=step)
        run.finish()

    samples = _run_worker(settings, f"verl-{uuid.uuid4().hex[:6]}", train)
    steps = [s for s in samples if s.kind == "step"]
    assert [(s.step, s.loss, s.grad_norm, s.step_time_ms) for s in steps] == [
        (1, 0.5, 2.0, 3500.0), (2, 0.25, 1.0, 3500.0)]
    episodes = [(e.reward, e.length) for e in samples if e.kind == "episode"]
    assert episodes == [(0.25, 97), (0.5, 98)]


def test_dsec_run_adds_the_verl_backend_to_every_tracking(settings, tmp_path) -> None:
    pytest.importorskip("verl.utils.tracking")
    ensure_topics(settings)
    code = ("from verl.utils.tracking import Tracking; "
            "t = Tracking('p', 'e', default_backend='console'); print(sorted(t.logger)); "
            "t.log({'actor/pg_loss': 0.5, 'critic/score/mean': 1.0}, step=1)")
    env = {**os.environ, "DSEC_BOOTSTRAP": settings.bootstrap,
           "DSEC_TOPIC_PREFIX": settings.topic_prefix, "DSEC_DATA_DIR": str(tmp_path),
           "DSEC_ACTUATOR_CHANNEL": "kafka"}
    worker = f"verl-run-{uuid.uuid4().hex[:6]}"
    out = subprocess.run([sys.executable, "-m", "dsec.cli", "run", "--worker-id", worker, "--",
                          sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'dsec'" in out.stdout.splitlines()[0]
    batches = consume_batches(
        settings.bootstrap, topic_names(settings.topic_prefix).metrics,
        lambda got: {s.kind for b in got if b.identity.worker_id == worker
                     for s in b.rows()} >= {"step", "episode"}, 60)
    assert any(s.kind == "step" and s.loss == 0.5 for b in batches
               if b.identity.worker_id == worker for s in b.rows())
