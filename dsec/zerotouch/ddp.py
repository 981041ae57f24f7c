"""DDP without code: every ``DistributedDataParallel`` built gets a timed communication hook.

The hook registered at construction times each gradient bucket (``ddp_bucket_all_reduce``
samples) around DDP's own all-reduce hook. DDP takes one hook per model, so a hook the
program registers later is not registered again: it takes the all-reduce's place behind
the timing. The reduction itself is never changed here: a gradient compression command
reaches one worker, and one rank switching its collectives alone would leave the others
waiting on it.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from dsec.ingest.grad_sync import CommHook, GradSyncTimer, timed_comm_hook


class DdpHooks:
    def __init__(self, timer: GradSyncTimer) -> None:
        self._timer = timer
        # model -> (the program's own hook, its state), once it registered one
        self._own: weakref.WeakKeyDictionary[Any, tuple[CommHook, Any]] = (
            weakref.WeakKeyDictionary())
        self._hooked: weakref.WeakSet[Any] = weakref.WeakSet()

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
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
                allreduce_hook,
            )

            return allreduce_hook(process_group, bucket)

        return reduce
