"""The worker's apply hooks: one callable per action kind, run on the training thread."""

from __future__ import annotations

from collections.abc import Callable

from dsec.schemas import ActionKind, ActuationStatus
from dsec.schemas.base import Model

ApplyHook = Callable[[Model], str | None]  # returns a detail for the result, or None


class NoApplyHookError(LookupError):
    def __init__(self, kind: ActionKind) -> None:
        super().__init__(f"this worker has no apply hook for {kind.value!r}")
        self.kind = kind


class ApplyHooks:
    def __init__(self) -> None:
        self._hooks: dict[ActionKind, ApplyHook] = {}
        self.in_force: dict[ActionKind, str] = {}  # kind -> actuation id last applied

    def register(self, kind: ActionKind | str, hook: ApplyHook) -> None:
        self._hooks[ActionKind(kind)] = hook

    def kinds(self) -> frozenset[ActionKind]:
        return frozenset(self._hooks)

    def apply(self, params: Model, actuation_id: str | None = None) -> str:
        kind = ActionKind(params.kind)  # type: ignore[attr-defined]
        hook = self._hooks.get(kind)
        if hook is None:
            raise NoApplyHookError(kind)
        detail = hook(params) or ""
        if actuation_id is not None:
            self.in_force[kind] = actuation_id
        return detail

    def try_apply(self, params: Model, actuation_id: str | None = None) -> tuple[
            ActuationStatus, str]:
        """``apply`` on the training thread: the hook's failure is its status and detail,
        never raised into training."""
        try:
            return ActuationStatus.APPLIED, self.apply(params, actuation_id)
        except Exception as exc:
            return ActuationStatus.FAILED, f"{type(exc).__name__}: {exc}"
