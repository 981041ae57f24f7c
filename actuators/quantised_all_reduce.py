"""A quantised all-reduce whose traffic per rank does not grow with the group.

The gradient is cut into one chunk per rank. Each rank quantises every chunk of its own
gradient and sends chunk ``j`` to rank ``j`` (one ``all_to_all``: a reduce-scatter whose
sums are done after decoding); rank ``j`` decodes what it received, averages it,
quantises the average once more and every rank gathers the averaged chunks
(``all_gather``). Each phase sends ``world - 1`` chunk payloads from a rank, so a rank
puts ``2 (world - 1) / world`` of one quantised gradient on the wire, never more than
twice, where gathering every rank's whole quantised gradient would send ``world - 1``
times it.

Error feedback: what quantisation left out is kept and added to the next step's values,
per bucket, on both sides (each rank's contribution, and the chunk a rank re-quantises),
so rounding errors do not pile up over steps. A step whose gradient is not finite (an
fp16 overflow that a GradScaler will skip) drops the residual instead of carrying NaN on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsec.actuators.gradient_quantisation import (
    dequantise_rows,
    pack_payload,
    payload_bytes,
    quantise_rows,
    unpack_payload,
)


def ring_all_reduce_bytes(nbytes: int, world: int) -> int:
    """What one rank sends in a ring all-reduce of ``nbytes`` (gloo's and NCCL's large
    message algorithm): a reduce-scatter and an all-gather of ``world - 1`` chunks each."""
    return 2 * (world - 1) * -(-nbytes // world)


def chunk_columns(numel: int, world: int) -> int:
    """Values in each rank's chunk of a ``numel``-value gradient (the last one padded)."""
    return max(1, -(-numel // world))


def quantised_all_reduce_bytes(numel: int, world: int, bits: int) -> int:
    """What one rank sends in ``QuantisedAllReduce`` of a ``numel``-value gradient."""
    return 2 * (world - 1) * payload_bytes(chunk_columns(numel, world), bits)


@dataclass
class _Residuals:
    local: Any  # this rank's whole padded gradient: what its codes left out
    reduced: Any  # this rank's averaged chunk: what its re-quantised codes left out


def _residual(values: Any, codes: Any, scales: Any, bits: int, columns: int) -> Any:
    """What the codes leave out of ``values`` (overwritten); zeros when a value was not
    finite, which shows in its block's scale."""
    import torch

    sent = dequantise_rows(codes, scales, bits, columns).reshape(values.shape)
    # decided on the device: no host synchronisation in the hook
    return torch.where(torch.isfinite(scales).all(), values.sub_(sent), 0.0)


class QuantisedAllReduce:
    """Averages flat gradients over a process group in 8 or 4 bits; one per model."""

    def __init__(self, error_feedback: bool = True) -> None:
        self.error_feedback = error_feedback
        self._residuals: dict[int, _Residuals] = {}

    def forget(self) -> None:
        """Drops the residuals (compression turned off): at most one rounding step per
        value, lost once."""
        self._residuals.clear()

    def _residuals_for(self, key: int, padded: Any, columns: int) -> _Residuals | None:
        if not self.error_feedback:
            return None
        residuals = self._residuals.get(key)
        # DDP rebuilds its buckets after the first step, and a group can change size:
        # a residual of another shape belongs to another bucket
        if residuals is None or residuals.local.shape != padded.shape \
                or residuals.reduced.numel() != columns:
            residuals = _Residuals(padded.new_zeros(padded.shape), padded.new_zeros(columns))
            self._residuals[key] = residuals
        return residuals

    def average(self, values: Any, bits: int, group: Any = None,
                key: int = 0) -> tuple[Any, int]:
        """(a future of ``values`` overwritten by the group's average, bytes this rank
        sends for it). ``key`` tells buckets apart for error feedback."""
        import torch
        import torch.distributed as dist

        world = dist.get_world_size(group)
        numel = values.numel()
        columns = chunk_columns(numel, world)
        padded = values.new_zeros(world * columns, dtype=torch.float32)
        padded[:numel] = values.reshape(-1)
        residuals = self._residuals_for(key, padded, columns)
        if residuals is not None:
            padded += residuals.local
        codes, scales = quantise_rows(padded.view(world, columns), bits)
        if residuals is not None:
            residuals.local = _residual(padded, codes, scales, bits, columns)
        outgoing = pack_payload(codes, scales)
        incoming = torch.empty_like(outgoing)
        exchanged = dist.all_to_all_single(incoming, outgoing, group=group, async_op=True)

        def reduce_and_gather(_done: Any) -> Any:
            received_codes, received_scales = unpack_payload(incoming, bits, columns)
            mine = dequantise_rows(received_codes, received_scales, bits, columns).sum(dim=0)
            mine.div_(world)
            if residuals is not None:
                mine += residuals.reduced
            chunk_codes, chunk_scales = quantise_rows(mine.view(1, columns), bits)
            if residuals is not None:
                residuals.reduced = _residual(mine, chunk_codes, chunk_scales, bits, columns)
            chunk = pack_payload(chunk_codes, chunk_scales).view(-1)
            gathered = chunk.new_empty(world * chunk.numel())
            dist.all_gather_into_tensor(gathered, chunk, group=group)
            all_codes, all_scales = unpack_payload(gathered.view(world, -1), bits, columns)
            averaged = dequantise_rows(all_codes, all_scales, bits, columns).reshape(-1)
            return values.copy_(averaged[:numel].view(values.shape))

        future = exchanged.get_future().then(reduce_and_gather)
        return future, quantised_all_reduce_bytes(numel, world, bits)
