"""DDP without code: every ``DistributedDataParallel`` built gets a timed communication hook.

The hook registered at construction times each gradient bucket (``ddp_bucket_all_reduce``
samples) and hands the bucket to what reduces it: the actuator's gradient compression
(plain all-reduce at 32 bits, as DDP's own hook) once the runtime has started, DDP's
all-reduce hook before that. DDP takes one hook per model, so a hook the program registers
later is not registered again: it takes the compression's place behind the timing (and
compression commands then fail, saying why).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from dsec.ingest.grad_sync import CommHook, GradSyncTimer, timed_comm_hook

PROGRAM_HOOK = "the program registered a DDP communication hook of its own"
NO_DDP = ("no DistributedDataParallel model in this process; gradient compression needs "
          "one (built after `dsec run` started the program)")


class DdpHooks:
    def __init__(self, timer: GradSyncTimer, compression: Callable[[], CommHook | None]) -> None:
        """``compression``: the running runtime's compression hook, or None before it starts."""
        self._timer = timer
        self._compression = compression
        # model -> (the program's own hook, its state), once it registered one
        self._own: weakref.WeakKeyDictionary[Any, tuple[CommHook, Any]] = (
            weakref.WeakKeyDictionary())
        self._hooked: weakref.WeakSet[Any] = weakref.WeakSet()

    @property
    def compressible(self) -> str | None:
        """Why gradient compression cannot apply here, or None when it can."""
        if not len(self._hooked):
            return NO_DDP
        if any(model in self._own for model in self._hooked):
            return PROGRAM_HOOK
        return None

    def install(self, ddp_class: Any) -> None:
        original_init = ddp_class.__init__
        if getattr(original_init, "__dsec_hooks__", None) is not None:
            return
        original_register = ddp_class.register_comm_hook

        @functools.wraps(original_init)
        def __init__(model: Any, *args: Any, **kwargs: Any) -> None:
            original_init(model, *args, **kwargs)
            original_register(model, getattr(model, "process_group", None),
                              timed_comm_hook(self._timer, self._reducer(model)))
            self._hooked.add(model)

        @functools.wraps(original_register)
        def register_comm_hook(model: Any, state: Any, hook: CommHook) -> None:
            if model not in self._hooked:
                original_register(model, state, hook)
                return
            model._check_comm_hook(hook)  # what DDP would refuse, refused as DDP would
            self._own[model] = (hook, state)

        __init__.__dsec_hooks__ = self  # type: ignore[attr-defined]
        ddp_class.__init__ = __init__
        ddp_class.register_comm_hook = register_comm_hook

    def _reducer(self, model: Any) -> CommHook:
        model_ref = weakref.ref(model)

        def reduce(process_group: Any, bucket: Any) -> Any:
            own = self._own.get(model_ref())
            if own is not None:
                hook, state = own
                return hook(state, bucket)
            compression = self._compression()
            if compression is not None:
                return compression(process_group, bucket)
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
                allreduce_hook,
            )

            return allreduce_hook(process_group, bucket)

        return reduce
