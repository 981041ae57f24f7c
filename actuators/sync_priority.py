"""Gradient-sync priority: a rank's weight in its data-parallel group's gradient average.

Level ``l`` (-3 … 3) weighs the rank's gradient by ``w = 2**l``: the group's gradient is
``sum(w_i * g_i) / sum(w_i)`` instead of the plain mean (the same when every level is 0).
Each rank multiplies its bucket by its weight before the average, and the group
all-reduces the sum of the weights beside it (one more scalar per bucket), so no rank
needs to know the others' levels. Every rank ends with the same gradient, so the
replicas stay identical; a rank at -3 still counts, an eighth as much as one at 0.

The trade-off: a down-weighted rank's data counts for less in the update (its samples
are partly wasted), and the average leans on the others; the rank still takes part in
every sync, so this does not make the group wait less for a slow rank.
"""

from __future__ import annotations

from typing import Any

from dsec.actuators.effects import Effect, Pending
from dsec.actuators.loop_setting import LoopSetting
from dsec.schemas.actuations import SyncPriorityParams

CommHook = Any  # (state, bucket) -> torch.futures.Future[Tensor], as DDP calls it


def sync_weight(level: int) -> float:
    return 2.0 ** level


class SyncPriority(LoopSetting[int]):
    """The level in force is the one the sync hook last weighed a bucket with."""

    what = "sync priority"
    unattached = "no gradient sync of this worker weighs its gradient by priority"
    attach_hint = "call dsec.watch_ddp(model) after wrapping the model in DDP"

    def __init__(self, level: int = 0) -> None:
        super().__init__(level)

    @property
    def level(self) -> int:
        return self.requested

    def apply(self, params: SyncPriorityParams) -> Effect | Pending:
        return self.request(params.level)

    def weight(self) -> float:
        """This rank's weight for the sync about to run (a sync of the loop's own calls it
        once per all-reduce, and divides by the group's sum of weights)."""
        return sync_weight(self.take(self.requested))

    def comm_hook(self, inner: CommHook) -> CommHook:
        """A DDP communication hook: ``inner`` (a hook that averages the bucket over the
        group, such as DDP's all-reduce or the gradient compression's) on this rank's
        weighted bucket, turned into the weighted average. Its state is the process
        group (None: the default one), passed on to ``inner``."""
        self.mark_attached()

        def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
            import torch
            import torch.distributed as dist

            group = state if isinstance(state, dist.ProcessGroup) else dist.group.WORLD
            world = dist.get_world_size(group)
            weight = self.weight()
            buffer = bucket.buffer()
            weights = torch.tensor([weight], dtype=torch.float32, device=buffer.device)
            # issued before inner's collectives, in the same order on every rank
            weights_done = dist.all_reduce(weights, group=group, async_op=True).get_future()
            if weight != 1.0:
                buffer.mul_(weight)
            averaged = inner(state, bucket)  # sum(w_i * g_i) / world

            def reweigh(done: Any) -> Any:
                mean_of_weighted = done.value()[1].value()
                total_weight = float(weights[0])
                if total_weight == float(world):
                    return mean_of_weighted
                return mean_of_weighted.mul_(world / total_weight)

            return torch.futures.collect_all([weights_done, averaged]).then(reweigh)

        return hook
