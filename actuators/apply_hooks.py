"""The worker's apply hooks: one callable per action kind, run on the training thread.

A hook returns a detail (the action is applied), an ``Effect`` (applied, unsupported, …
with the setting asked for and the one in force) or a ``Pending`` effect, which the
training thread settles at its step boundaries (``settle``) once the loop has taken the
new setting up. A newer command of the same kind supersedes one still pending.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dsec.actuators.effects import Effect, HookResult, Pending
from dsec.schemas import ActionKind, ActuationStatus
from dsec.schemas.base import Model

ApplyHook = Callable[[Model], HookResult]
# (kind, actuation id, effect): every final effect, immediate or settled
EffectObserver = Callable[[ActionKind, str | None, Effect], None]


class NoApplyHookError(LookupError):
    def __init__(self, kind: ActionKind) -> None:
        super().__init__(f"this worker has no apply hook for {kind.value!r}")
        self.kind = kind


@dataclass(frozen=True)
class Settled:
    """A pending command's final effect, to report for ``actuation_id``."""

    actuation_id: str | None
    kind: ActionKind
    effect: Effect


@dataclass
class _Waiting:
    actuation_id: str | None
    pending: Pending


class ApplyHooks:
    def __init__(self) -> None:
        self._hooks: dict[ActionKind, ApplyHook] = {}
        self.in_force: dict[ActionKind, str] = {}  # kind -> actuation id last applied
        self._waiting: dict[ActionKind, _Waiting] = {}
        self._settled: list[Settled] = []
        self._observers: list[EffectObserver] = []

    def register(self, kind: ActionKind | str, hook: ApplyHook) -> None:
        self._hooks[ActionKind(kind)] = hook

    def kinds(self) -> frozenset[ActionKind]:
        return frozenset(self._hooks)

    def observe(self, observer: EffectObserver) -> None:
        """``observer`` hears every final effect, on the training thread."""
        self._observers.append(observer)

    def apply(self, params: Model, actuation_id: str | None = None) -> Effect | None:
        """Runs the hook; the effect to report now, or None while it is pending (it is
        reported from ``settle``). Raises what the hook raises."""
        kind = ActionKind(params.kind)  # type: ignore[attr-defined]
        hook = self._hooks.get(kind)
        if hook is None:
            raise NoApplyHookError(kind)
        result = hook(params)
        self._supersede(kind, actuation_id)
        if isinstance(result, Pending):
            self._waiting[kind] = _Waiting(actuation_id, result)
            if result.now is not None:
                self._finish(kind, actuation_id, result.now, later=False)
            return result.now
        effect = result if isinstance(result, Effect) else Effect.applied(result or "")
        self._finish(kind, actuation_id, effect, later=False)
        return effect

    def try_apply(self, params: Model, actuation_id: str | None = None) -> Effect | None:
        """``apply`` on the training thread: a hook's failure is its effect, never raised
        into training; an action this worker has no hook for is unsupported."""
        try:
            return self.apply(params, actuation_id)
        except NoApplyHookError as exc:
            return Effect(ActuationStatus.UNSUPPORTED,
                          f"{exc}; register one with @dsec.on_action({exc.kind.value!r})")
        except Exception as exc:
            return Effect(ActuationStatus.FAILED, f"{type(exc).__name__}: {exc}")

    def settle(self) -> list[Settled]:
        """Asks each pending effect whether the loop has taken it up (call on the training
        thread at a step boundary); what settled since the last call, superseded ones
        included."""
        for kind, waiting in list(self._waiting.items()):
            try:
                effect = waiting.pending.settle()
            except Exception as exc:
                effect = Effect(ActuationStatus.FAILED, f"{type(exc).__name__}: {exc}")
            if isinstance(effect, Pending):  # still watched, or waiting again
                waiting.pending = effect
                if effect.now is not None:
                    self._finish(kind, waiting.actuation_id, effect.now, later=True)
            elif effect is not None:
                del self._waiting[kind]
                self._finish(kind, waiting.actuation_id, effect, later=True)
        settled, self._settled = self._settled, []
        return settled

    def pending(self) -> dict[ActionKind, str | None]:
        """Kind -> actuation id of each command waiting for the loop."""
        return {kind: waiting.actuation_id for kind, waiting in self._waiting.items()}

    def _supersede(self, kind: ActionKind, by: str | None) -> None:
        waiting = self._waiting.pop(kind, None)
        if waiting is None or (by is not None and waiting.actuation_id == by):
            return  # nothing waiting, or the same command again (re-sent on registration)
        if waiting.actuation_id is not None and self.in_force.get(kind) == waiting.actuation_id:
            return  # applied and watched: the newer command takes over from it
        effect = Effect(ActuationStatus.SUPERSEDED,
                        f"superseded by {by or 'a newer command'} before it took effect")
        self._settled.append(Settled(waiting.actuation_id, kind, effect))
        self._observe(kind, waiting.actuation_id, effect)

    def _finish(self, kind: ActionKind, actuation_id: str | None, effect: Effect, *,
                later: bool) -> None:
        """``later``: settled after ``apply`` returned, so ``settle`` hands it on."""
        if effect.status is ActuationStatus.APPLIED and actuation_id is not None:
            self.in_force[kind] = actuation_id
        elif actuation_id is not None and self.in_force.get(kind) == actuation_id:
            del self.in_force[kind]  # the command in force is no longer (a lifted cap)
        if later:
            self._settled.append(Settled(actuation_id, kind, effect))
        self._observe(kind, actuation_id, effect)

    def _observe(self, kind: ActionKind, actuation_id: str | None, effect: Effect) -> None:
        for observer in self._observers:
            observer(kind, actuation_id, effect)
