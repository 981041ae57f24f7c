"""GPU health from NVML (``nvidia-ml-py``) on a thread of its own.

Every field is read on its own: a GPU that does not support one (power on some boards)
still reports the rest. A host without NVML says so once and the sampler stays idle.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1


class FieldSink(Protocol):
    def record_fields(self, kind: str, fields: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class _Device:
    index: int
    handle: Any
    uuid: str
    model: str


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read(function: Callable[..., Any], *args: Any) -> Any:
    try:
        return function(*args)
    except Exception:  # NVMLError_NotSupported and friends: the field is left out
        return None


def _throttle_reasons(nvml: Any, handle: Any) -> int | None:
    # The "clocks event" name replaced "throttle" in newer drivers; older bindings lack it.
    reader = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    return None if reader is None else _read(reader, handle)


def gpu_fields(nvml: Any, device: _Device) -> dict[str, Any] | None:
    """One ``gpu`` sample's fields; None when even the memory cannot be read."""
    memory = _read(nvml.nvmlDeviceGetMemoryInfo, device.handle)
    if memory is None:
        return None
    fields: dict[str, Any] = {
        "gpu_uuid": device.uuid,
        "gpu_model": device.model[:128],
        "memory_used_bytes": int(memory.used),
        "memory_total_bytes": int(memory.total),
    }
    utilisation = _read(nvml.nvmlDeviceGetUtilizationRates, device.handle)
    if utilisation is not None:
        fields["utilisation_pct"] = float(min(100, max(0, utilisation.gpu)))
    temperature_c = _read(nvml.nvmlDeviceGetTemperature, device.handle, NVML_TEMPERATURE_GPU)
    if temperature_c is not None:
        fields["temperature_c"] = float(temperature_c)
    sm_clock_mhz = _read(nvml.nvmlDeviceGetClockInfo, device.handle, NVML_CLOCK_SM)
    if sm_clock_mhz is not None:
        fields["sm_clock_mhz"] = float(sm_clock_mhz)
    reasons = _throttle_reasons(nvml, device.handle)
    if reasons is not None:
        fields["throttle_reasons"] = int(reasons)
    power_mw = _read(nvml.nvmlDeviceGetPowerUsage, device.handle)
    if power_mw is not None:
        fields["power_w"] = float(power_mw) / 1000.0
    return fields


def _load_pynvml() -> Any:
    import pynvml

    return pynvml


class NvmlSampler:
    """Samples every ``interval_s`` each GPU in ``gpu_indices`` (None: all) into ``sink``.

    ``nvml`` is the pynvml module, or a stand-in with the same functions (tests).
    """

    def __init__(
        self,
        sink: FieldSink,
        interval_s: float,
        gpu_indices: Sequence[int] | None = None,
        nvml: Any = None,
    ) -> None:
        self._sink = sink
        self._interval_s = interval_s
        self._gpu_indices = gpu_indices
        self._nvml = nvml
        self._devices: list[_Device] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.available: bool | None = None  # None until NVML was tried
        self.unavailable_reason = ""
        self.samples_taken = 0

    def open(self) -> bool:
        """Initialises NVML and finds the GPUs; False (said once, in the log) when absent."""
        try:
            nvml = self._nvml if self._nvml is not None else _load_pynvml()
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
            indices = range(count) if self._gpu_indices is None else self._gpu_indices
            devices = []
            for index in indices:
                if not 0 <= index < count:
                    continue
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                devices.append(_Device(
                    index=index,
                    handle=handle,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    model=_text(_read(nvml.nvmlDeviceGetName, handle) or ""),
                ))
        except Exception as exc:
            self.available = False
            self.unavailable_reason = f"{type(exc).__name__}: {exc}"
            log.info("dsec: NVML unavailable (%s); no GPU samples from this process",
                     self.unavailable_reason)
            return False
        self._nvml = nvml
        self._devices = devices
        self.available = True
        return True

    def sample_once(self) -> int:
        """Records one sample per GPU; returns how many."""
        taken = 0
        for device in self._devices:
            fields = gpu_fields(self._nvml, device)
            if fields is not None:
                self._sink.record_fields("gpu", fields)
                taken += 1
        self.samples_taken += taken
        return taken

    def start(self) -> NvmlSampler:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="dsec-nvml", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        if not self.open() or not self._devices:
            return
        while True:
            try:
                self.sample_once()
            except Exception:  # the training job outlives a misbehaving driver
                log.exception("dsec: NVML sample failed")
            if self._stop.wait(self._interval_s):
                return

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout=5)
        if self.available:
            _read(self._nvml.nvmlShutdown)
            self.available = None
