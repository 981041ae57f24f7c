"""Actuators: receive actuation commands for a node and apply them inside its workers."""

from dsec.actuators.apply_hooks import ApplyHooks, NoApplyHookError
from dsec.actuators.gate import CommandGate, Rejection
from dsec.actuators.in_process import InProcessActuator
from dsec.actuators.node_daemon import NodeActuator, NodeActuatorConfig
from dsec.actuators.worker_channel import WorkerChannel
from dsec.actuators.worker_controls import WorkerControls

__all__ = [
    "ApplyHooks",
    "CommandGate",
    "InProcessActuator",
    "NoApplyHookError",
    "NodeActuator",
    "NodeActuatorConfig",
    "Rejection",
    "WorkerChannel",
    "WorkerControls",
]
