"""The public surface, guarded: a rename here is a breaking change for training scripts."""

from __future__ import annotations

import dsec
import dsec.actuators


def test_dsec_public_names() -> None:
    assert set(dsec.__all__) == {
        "ActionKind", "ProbeConfig", "ProbeCounters", "RestoredState", "WorkerControls",
        "WorkerRuntime", "apply_pending", "autocast", "clip_grad_norm_", "controls", "current",
        "enable_snapshots", "init", "note_accumulation", "note_grad_norm", "on_action",
        "report_episode_end", "report_resume", "report_step", "restore", "sb3_callback",
        "shutdown", "skip_nonfinite_steps", "trainer_callback",
        "training_step", "watch_ddp", "wrap_env",
    }
    assert all(hasattr(dsec, name) for name in dsec.__all__)


def test_actuators_public_names() -> None:
    assert set(dsec.actuators.__all__) == {
        "ApplyHooks", "CommandGate", "InProcessActuator", "NoApplyHookError", "NodeActuator",
        "NodeActuatorConfig", "Rejection", "WorkerChannel", "WorkerControls",
    }
    assert all(hasattr(dsec.actuators, name) for name in dsec.actuators.__all__)


