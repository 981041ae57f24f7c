"""Actuators: receive actuation commands for a node and apply them inside its workers."""

from dsec.actuators.apply_hooks import ApplyHooks, NoApplyHookError
from dsec.actuators.gate import CommandGate, Rejection
from dsec.actuators.in_process import InProcessActuator

__all__ = ["ApplyHooks", "CommandGate", "InProcessActuator", "NoApplyHookError", "Rejection"]
