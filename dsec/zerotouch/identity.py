"""Who an instrumented process is, from its environment: pure functions of what they read.

- ``DSEC_WORKER_ID`` names the worker outright;
- else ``DSEC_SANDBOX_ID`` (the agent sandbox it runs in), or Ray's actor or worker id
  when the process runs inside Ray, or the host name, then ``-rank{RANK}`` under torchrun
  (``RANK`` set) and, with none of those, ``-{pid}`` so that two processes on a host differ;
- the node is ``DSEC_NODE_ID`` or the host name, as the node actuator names it;
- NVML samples the GPU of ``LOCAL_RANK`` (through ``CUDA_VISIBLE_DEVICES`` when that lists
  indices), so the ranks of one node do not each sample every GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

# Named tuples, not dataclasses: this loads in every process ``dsec run`` starts, and
# ``dataclasses`` pulls in ``inspect``.
MAX_ID_CHARS = 128
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-/")


class RayContext(NamedTuple):
    """What the process knows of Ray (``ray.get_runtime_context()``), when it runs in Ray."""

    actor_id: str | None = None
    worker_id: str | None = None


class ProcessIdentity(NamedTuple):
    worker_id: str
    node_id: str
    rank: int | None
    local_rank: int | None
    world_size: int | None


def safe_id(text: str) -> str:
    """An identifier dsec accepts (letters, digits, ``_.:-/``; at most 128 characters)."""
    return "".join(c if c in _SAFE else "_" for c in text[:MAX_ID_CHARS]) or "_"


def _int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def process_identity(
    env: Mapping[str, str], hostname: str, pid: int, ray: RayContext | None = None
) -> ProcessIdentity:
    rank = _int(env, "RANK")
    node_id = safe_id(env.get("DSEC_NODE_ID") or hostname)
    worker_id = env.get("DSEC_WORKER_ID")
    if not worker_id:
        sandbox = env.get("DSEC_SANDBOX_ID")
        ray_id = ray and (ray.actor_id or ray.worker_id)
        base = sandbox or (f"ray-{ray_id}" if ray_id else hostname)
        if rank is not None:
            worker_id = f"{base}-rank{rank}"
        elif sandbox or ray_id:
            worker_id = base
        else:
            worker_id = f"{base}-{pid}"
    return ProcessIdentity(worker_id=safe_id(worker_id), node_id=node_id, rank=rank,
                           local_rank=_int(env, "LOCAL_RANK"),
                           world_size=_int(env, "WORLD_SIZE"))


def nvml_indices(env: Mapping[str, str]) -> tuple[int, ...] | None:
    """The NVML index of this rank's GPU, or None (every GPU) without ``LOCAL_RANK``.

    NVML counts every GPU of the host; CUDA counts those ``CUDA_VISIBLE_DEVICES`` lists.
    A list of UUIDs or MIG devices cannot be mapped by index: every GPU then.
    """
    local_rank = _int(env, "LOCAL_RANK")
    if local_rank is None:
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return (local_rank,)
    entries = [entry.strip() for entry in visible.split(",")]
    if local_rank >= len(entries) or not entries[local_rank].isdigit():
        return None
    return (int(entries[local_rank]),)


def ray_context() -> RayContext | None:
    """Ray's runtime context when this process imported Ray and runs in a Ray job."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        context = ray.get_runtime_context()
        return RayContext(actor_id=context.get_actor_id(), worker_id=context.get_worker_id())
    except Exception:  # an older or partial Ray: identity from the rest of the environment
        return None
