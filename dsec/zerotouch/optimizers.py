"""The optimizers a program builds, and the state a zero-touch snapshot takes through them.

``dsec run`` cannot see the program's model, only its optimizers (every
``torch.optim.Optimizer`` built is remembered, weakly). A zero-touch snapshot saves what
they hold: every parameter they update (``OptimizerParams``, a state dict keyed
``"{optimizer}.{group}.{index}"``), their state (``Optimizers``, one optimizer's state
dict made of all of them) and the RNG. What no optimizer holds, a model's buffers
(batch-norm statistics) and frozen parameters, is not in it: one line,
``dsec.enable_snapshots(model, optimizer)``, snapshots the whole model instead.
Both views load back: ``dsec.restore(location, OptimizerParams([opt]), Optimizers([opt]))``.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any


class OptimizerRegistry:
    """Every optimizer built after ``install``, in the order they were built."""

    def __init__(self) -> None:
        self._built: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._count = 0
        self._lock = threading.Lock()

    def install(self, optimizer_class: Any) -> None:
        """Wraps ``optimizer_class.__init__`` (``torch.optim.Optimizer``: subclasses call it)."""
        original = optimizer_class.__init__
        if getattr(original, "__dsec_registry__", None) is not None:
            return

        @functools.wraps(original)
        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            self.add(optimizer)

        __init__.__dsec_registry__ = self  # type: ignore[attr-defined]
        optimizer_class.__init__ = __init__

    def add(self, optimizer: Any) -> None:
        with self._lock:
            if optimizer not in self._built:
                self._built[optimizer] = self._count
                self._count += 1

    def live(self) -> list[Any]:
        with self._lock:
            return sorted(self._built.keys(), key=self._built.__getitem__)


class OptimizerParams:
    """The parameters of some optimizers as a module's state dict (``state_dict`` and
    ``load_state_dict``), for a snapshot taken without the model."""

    def __init__(self, optimizers: Sequence[Any]) -> None:
        self._optimizers = list(optimizers)

    def named_parameters(self) -> list[tuple[str, Any]]:
        return [
            (f"{o}.{g}.{p}", param)
            for o, optimizer in enumerate(self._optimizers)
            for g, group in enumerate(optimizer.param_groups)
            for p, param in enumerate(group["params"])
        ]

    def state_dict(self) -> dict[str, Any]:
        return {name: param.detach() for name, param in self.named_parameters()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import torch

        names = dict(self.named_parameters())
        if set(names) != set(state):
            missing, unexpected = sorted(set(names) - set(state)), sorted(set(state) - set(names))
            raise KeyError(f"parameters do not match: missing {missing}, unexpected {unexpected}")
        with torch.no_grad():
            for name, param in names.items():
                param.copy_(state[name])


class Optimizers:
    """Several optimizers as one for the snapshotter: one state dict (states numbered on
    across optimizers, groups one after the other), and pre-step hooks on each."""

    def __init__(self, optimizers: Sequence[Any]) -> None:
        self._optimizers = list(optimizers)

    def state_dict(self) -> dict[str, Any]:
        state: dict[int, Any] = {}
        groups: list[dict[str, Any]] = []
        offset = 0
        for optimizer in self._optimizers:
            own = optimizer.state_dict()
            for index, values in own["state"].items():
                state[index + offset] = values
            for group in own["param_groups"]:
                groups.append({**group, "params": [i + offset for i in group["params"]]})
            offset += sum(len(group["params"]) for group in own["param_groups"])
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = iter(state_dict["param_groups"])
        offset = 0
        for optimizer in self._optimizers:
            own_groups = [next(groups) for _ in optimizer.param_groups]
            count = sum(len(group["params"]) for group in own_groups)
            optimizer.load_state_dict({
                "state": {int(index) - offset: values
                          for index, values in state_dict["state"].items()
                          if offset <= int(index) < offset + count},
                "param_groups": [{**group, "params": [i - offset for i in group["params"]]}
                                 for group in own_groups],
            })
            offset += count

    def register_step_pre_hook(self, hook: Callable[..., Any]) -> Any:
        return _Handles([optimizer.register_step_pre_hook(hook)
                         for optimizer in self._optimizers])


class _Handles:
    def __init__(self, handles: list[Any]) -> None:
        self._handles = handles

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
