"""The experiment's arms: what each one's workers resume from and how its launcher restarts
them. The same cluster, faults and seeds run under every arm; only these differ."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArmConfig:
    name: str
    # dsec's policies only observe (decisions audited, nothing commanded).
    dry_run: bool
    # Each worker writes its state (model, optimizer, update count) from a background
    # thread every ``snapshot_interval_s``, as DCP ``async_save`` or a ``torch.save``
    # thread would: the same interval and content as dsec's snapshots.
    async_checkpoints: bool
    # The group resumes from the newer of the full checkpoint and the worker's latest
    # dsec snapshot.
    dsec_snapshots: bool
    # Only the failed worker restarts: the survivors keep their weights in memory and
    # hand them to the replacement when the group re-forms (TorchElastic / NVRx in-job
    # restart). Without it the survivors roll back to the resume point, as plain DDP.
    elastic: bool
    # The launcher restarts a worker whose update counter stopped advancing while the
    # process lives on (NVRx's in-job heartbeat from the training loop).
    progress_watchdog: bool
    # dsec's step guard (``dsec.skip_nonfinite_steps``): an optimizer step whose gradients
    # are not finite is skipped at any precision, as loss scaling does in fp16.
    skip_nonfinite_steps: bool = False


PLAIN = ArmConfig("plain", dry_run=True, async_checkpoints=False, dsec_snapshots=False,
                  elastic=False, progress_watchdog=False)
STRONG = ArmConfig("strong", dry_run=True, async_checkpoints=True, dsec_snapshots=False,
                   elastic=True, progress_watchdog=True)
# dsec on top of the same launcher as the strong arm: what it adds is prevention.
DSEC = ArmConfig("dsec", dry_run=False, async_checkpoints=False, dsec_snapshots=True,
                 elastic=True, progress_watchdog=True, skip_nonfinite_steps=True)
ARM_CONFIGS: dict[str, ArmConfig] = {arm.name: arm for arm in (PLAIN, STRONG, DSEC)}
ARMS: tuple[str, ...] = tuple(ARM_CONFIGS)


def arms_of(result: dict) -> list[str]:
    """The arms a result holds (a run of a subset of the arms holds only those)."""
    return [arm for arm in ARMS if arm in result]
