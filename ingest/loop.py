"""A step scope for custom training loops: a context manager that is also a decorator."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class StepSink(Protocol):
    @property
    def global_step(self) -> int: ...

    @property
    def watching(self) -> bool: ...

    def note_loss(self, loss: Any) -> None: ...

    def note_grad_norm(self, total_norm: Any) -> None: ...

    def record_step(self, loss: Any = None, grad_norm: Any = None) -> None: ...


class StepScope:
    """One training step.

    ``with scope: ...`` records a step sample on exit, unless a watched optimizer already
    recorded one inside the block; ``scope.loss`` / ``scope.note_grad_norm`` add to it. As a
    decorator, a float or tensor returned by the function is taken as the loss. A block that
    raises records nothing and the exception goes on.
    """

    def __init__(self, sink_getter: Callable[[], StepSink]) -> None:
        self._sink_getter = sink_getter
        self._sink: StepSink | None = None
        self._step_before = 0
        self.loss: Any = None

    def __enter__(self) -> StepScope:
        self._sink = self._sink_getter()
        self._step_before = self._sink.global_step
        self.loss = None
        return self

    def note_loss(self, loss: Any) -> None:
        """The loss; with a watched optimizer, call before ``optimizer.step()``."""
        self.loss = loss
        if self._sink is not None and self._sink.watching:
            self._sink.note_loss(loss)

    def note_grad_norm(self, total_norm: Any) -> None:
        if self._sink is not None:
            self._sink.note_grad_norm(total_norm)

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        sink, self._sink = self._sink, None
        if exc_type is not None or sink is None:
            return
        if sink.global_step == self._step_before:
            sink.record_step(loss=self.loss)

    def __call__(self, function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            scope = StepScope(self._sink_getter)
            with scope:
                result = function(*args, **kwargs)
                if scope.loss is None and (
                    isinstance(result, float | int) or hasattr(result, "detach")
                ):
                    scope.loss = result
            return result

        return wrapper  # type: ignore[return-value]
