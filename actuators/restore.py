"""Rebuilding a worker's state from its snapshot chain (``dsec.restore()``)."""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dsec.actuators.snapshot_codec import dequantise_int8
from dsec.actuators.snapshot_store import ChainReport, read_chain, resolve_directory

log = logging.getLogger(__name__)

class NoSnapshotError(FileNotFoundError):
    def __init__(self, location: str, report: ChainReport) -> None:
        detail = f"; corrupt: {report.corrupt}" if report.corrupt else ""
        super().__init__(f"no restorable snapshot in {location}{detail}")
        self.report = report


@dataclass
class RestoredState:
    seq: int
    global_step: int
    meta: dict[str, Any]
    tensors: dict[str, Any]  # name -> torch tensor (CPU)
    report: ChainReport
    max_abs_error: dict[str, float] = field(default_factory=dict)  # quantised tensors only

    def model_state(self) -> dict[str, Any]:
        return {k[len("model."):]: v for k, v in self.tensors.items() if k.startswith("model.")}

    def optimizer_state(self) -> dict[str, Any] | None:
        if "optim_param_groups" not in self.meta:
            return None
        state: dict[int, dict[str, Any]] = {}
        for name, tensor in self.tensors.items():
            if name.startswith("optim."):
                _, index, key = name.split(".", 2)
                state.setdefault(int(index), {})[key] = tensor
        for index, scalars in self.meta.get("optim_scalars", {}).items():
            state.setdefault(int(index), {}).update(scalars)
        return {"state": state, "param_groups": self.meta["optim_param_groups"]}

    def restore_rng(self) -> None:
        import torch

        rng = self.meta.get("rng", {})
        if "rng.torch" in self.tensors:
            torch.set_rng_state(self.tensors["rng.torch"])
        if torch.cuda.is_available():
            for name, value in self.tensors.items():
                if name.startswith("rng.cuda."):
                    torch.cuda.set_rng_state(value, int(name.rsplit(".", 1)[1]))
        if "numpy" in rng and "rng.numpy.keys" in self.tensors:
            kind, pos, has_gauss, cached = rng["numpy"]
            keys = self.tensors["rng.numpy.keys"].numpy().astype(np.uint32)
            np.random.set_state((kind, keys, pos, has_gauss, cached))
        if "python" in rng:
            version, state, gauss = rng["python"]
            random.setstate((version, tuple(state), gauss))


def _to_tensor(raw: np.ndarray, dtype_name: str, shape: list[int], bf16: bool) -> Any:
    import torch

    array = raw.view(np.dtype(dtype_name)).reshape(shape)
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if bf16 else tensor


def restore(
    location: str | os.PathLike[str],
    model: Any = None,
    optimizer: Any = None,
    *,
    restore_rng: bool = True,
) -> RestoredState:
    """The newest verified state of the chain in ``location``, loaded into ``model`` and
    ``optimizer`` when given. A corrupt link is logged and reported in ``report.corrupt``."""
    directory = resolve_directory(location)
    manifest, buffers, report = read_chain(directory)
    if manifest is None:
        raise NoSnapshotError(os.fspath(location), report)
    for seq, reason in report.corrupt:
        log.error("dsec restore: snapshot %d is corrupt (%s); using %d",
                  seq, reason, report.restored_seq)
    tensors: dict[str, Any] = {}
    errors: dict[str, float] = {}
    records = {record.name: record for record in manifest.tensors}
    for name, record in records.items():
        if name.endswith("#scales"):
            continue
        raw = buffers[name]
        if record.quantised_from:
            import torch

            scales = buffers[f"{name}#scales"].view(np.float32)
            values = dequantise_int8(raw.view(np.int8), scales, record.block_elems)
            if record.transform == "sqrt":
                values = np.square(values)
            tensors[name] = torch.from_numpy(values.reshape(record.shape))
            errors[name] = record.max_abs_error
        else:
            tensors[name] = _to_tensor(raw, record.dtype, record.shape,
                                       record.torch_dtype == "bfloat16")
    state = RestoredState(
        seq=manifest.seq, global_step=int(manifest.meta.get("global_step", 0)),
        meta=manifest.meta, tensors=tensors, report=report, max_abs_error=errors,
    )
    if model is not None:
        model.load_state_dict(state.model_state())
    if optimizer is not None:
        optimizer_state = state.optimizer_state()
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
    if restore_rng:
        state.restore_rng()
    return state
