"""GPU health from NVML (``nvidia-ml-py``) on a thread of its own.

Every field is read on its own: a GPU that does not support one (power on some boards)
still reports the rest. A host without NVML says so once and the sampler stays idle.
The sampler reads the GPUs this process uses (``gpu_devices.own_devices``), and on each
the memory the process itself holds beside the card-wide figures.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dsec.ingest.gpu_devices import own_devices

log = logging.getLogger(__name__)

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1


class FieldSink(Protocol):
    def record_fields(self, kind: str, fields: dict[str, Any]) -> None: ...

    def name_gpu(self, gpu_uuid: str) -> None: ...


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


def process_memory_bytes(nvml: Any, handle: Any, pid: int) -> int | None:
    """What process ``pid`` holds on the GPU by NVML's count of its compute processes;
    None where NVML cannot tell (not supported, or the process is not among them: it has
    no context there yet, or NVML sees another PID namespace, as in some containers)."""
    reader = getattr(nvml, "nvmlDeviceGetComputeRunningProcesses", None)
    processes = None if reader is None else _read(reader, handle)
    if processes is None:
        return None
    used = [p.usedGpuMemory for p in processes if getattr(p, "pid", None) == pid]
    if not used or any(u is None for u in used):
        return None
    return int(sum(used))


def gpu_fields(nvml: Any, device: _Device, pid: int | None = None) -> dict[str, Any] | None:
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
    if pid is not None:
        own_bytes = process_memory_bytes(nvml, device.handle, pid)
        if own_bytes is not None:
            fields["process_memory_used_bytes"] = own_bytes
    return fields


def _load_pynvml() -> Any:
    import pynvml

    return pynvml


class NvmlSampler:
    """Samples every ``interval_s`` each GPU this process uses into ``sink``:
    ``gpu_indices`` when given, else the ones ``own_devices`` finds in ``env`` (the
    process's environment) and ``current_device`` (the CUDA device the training thread
    made current, once it has), else every GPU.

    ``nvml`` is the pynvml module, or a stand-in with the same functions (tests); ``pid``
    the process whose own memory is read (this one).
    """

    def __init__(
        self,
        sink: FieldSink,
        interval_s: float,
        gpu_indices: Sequence[int] | None = None,
        nvml: Any = None,
        env: Mapping[str, str] | None = None,
        current_device: Callable[[], int | None] | None = None,
        pid: int | None = None,
    ) -> None:
        self._sink = sink
        self._interval_s = interval_s
        self._gpu_indices = gpu_indices
        self._nvml = nvml
        self._env = os.environ if env is None else env
        self._current_device = current_device or (lambda: None)
        self._pid = os.getpid() if pid is None else pid
        self._all_devices: list[_Device] = []
        self._devices: list[_Device] = []
        self._chosen_by_current_device = False
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
            devices = []
            for index in range(count):
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
        self._all_devices = devices
        self.available = True
        self._choose()
        return True

    def _choose(self) -> None:
        """The devices to sample, from the configuration, the environment and the current
        CUDA device; the batches name the first as this process's GPU."""
        if self._gpu_indices is not None:
            wanted = [str(index) for index in self._gpu_indices]
        else:
            current = self._current_device()
            self._chosen_by_current_device = current is not None
            wanted = own_devices(self._env, current)
        if wanted is None:
            self._devices = list(self._all_devices)
            return
        by_key = {**{str(d.index): d for d in self._all_devices},
                  **{d.uuid: d for d in self._all_devices}}
        chosen = [by_key[key] for key in wanted if key in by_key]
        self._devices = list(dict.fromkeys(chosen))
        if len(self._devices) == 1 and hasattr(self._sink, "name_gpu"):
            self._sink.name_gpu(self._devices[0].uuid)

    @property
    def devices(self) -> list[str]:
        """The UUIDs of the GPUs sampled."""
        return [device.uuid for device in self._devices]

    def sample_once(self) -> int:
        """Records one sample per GPU; returns how many."""
        if self._gpu_indices is None and not self._chosen_by_current_device:
            self._choose()  # the training thread may have made its device current since
        taken = 0
        for device in self._devices:
            fields = gpu_fields(self._nvml, device, self._pid)
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
