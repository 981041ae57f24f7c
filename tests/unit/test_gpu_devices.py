"""Per-process GPU readings on the NVML test double: the probe samples the GPUs its
process uses, and on each the memory the process itself holds beside the card's."""

from __future__ import annotations

import pytest
from nvml_double import NvmlTestDouble
from recording import RecordingTransport, manual_probe

from dsec.ingest.gpu_devices import own_devices
from dsec.ingest.nvml import NvmlSampler

GIB = 1 << 30
CARD_0, CARD_1 = "GPU-00000000-aaaa-bbbb", "GPU-00000001-aaaa-bbbb"


@pytest.mark.parametrize(("env", "current", "expected"), [
    ({}, None, None),                                          # nothing says: every GPU
    ({"LOCAL_RANK": "1"}, None, ["1"]),
    ({"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "1"}, None, ["3"]),
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, None, ["2", "3"]),       # a process on two cards
    ({"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "0"}, 1, ["3"]),  # current device wins
    ({"CUDA_VISIBLE_DEVICES": "GPU-x, GPU-y"}, 0, ["GPU-x"]),
    ({"CUDA_VISIBLE_DEVICES": "5", "LOCAL_RANK": "3"}, None, ["5"]),  # one visible: that one
    ({"LOCAL_RANK": "not a rank"}, None, None),
])
def test_own_devices(env, current, expected) -> None:
    assert own_devices(env, current) == expected


def _sample(nvml: NvmlTestDouble, pid: int, env: dict[str, str], current=None):
    transport = RecordingTransport()
    probe = manual_probe(transport)
    sampler = NvmlSampler(probe, 60, nvml=nvml, env=env, pid=pid,
                          current_device=(lambda: current))
    assert sampler.open()
    sampler.sample_once()
    probe.flush()
    return sampler, transport


def test_two_processes_on_one_card_read_the_card_and_each_its_own_memory() -> None:
    nvml = NvmlTestDouble(processes={0: [(100, int(6.5 * GIB)), (200, int(6.5 * GIB))]},
                          used_bytes=[13 * GIB, 1 * GIB])
    for pid in (100, 200):
        sampler, transport = _sample(nvml, pid, {"CUDA_VISIBLE_DEVICES": "0"})
        assert sampler.devices == [CARD_0]
        (sample,) = transport.samples("gpu")  # card 1 is not this process's
        assert sample.memory_used_bytes == 13 * GIB
        assert sample.process_memory_used_bytes == int(6.5 * GIB)
        batch = transport.batches()[-1]
        assert batch.gpu_uuid == CARD_0  # its messages name its card


def test_one_process_on_two_cards_reads_both_with_its_memory_on_each() -> None:
    nvml = NvmlTestDouble(processes={0: [(300, 5 * GIB)], 1: [(300, 7 * GIB), (301, GIB)]})
    sampler, transport = _sample(nvml, 300, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert sampler.devices == [CARD_0, CARD_1]
    samples = {s.gpu_uuid: s for s in transport.samples("gpu")}
    assert samples[CARD_0].process_memory_used_bytes == 5 * GIB
    assert samples[CARD_1].process_memory_used_bytes == 7 * GIB
    assert transport.batches()[-1].gpu_uuid is None  # two cards: no one card to name


def test_the_current_device_narrows_the_choice_once_known() -> None:
    nvml = NvmlTestDouble(processes={1: [(400, 3 * GIB)]})
    device: list[int | None] = [None]
    transport = RecordingTransport()
    probe = manual_probe(transport)
    sampler = NvmlSampler(probe, 60, nvml=nvml, env={}, pid=400,
                          current_device=lambda: device[0])
    assert sampler.open() and sampler.sample_once() == 2  # not known yet: every GPU
    device[0] = 1  # the training thread made cuda:1 current
    assert sampler.sample_once() == 1 and sampler.devices == [CARD_1]


def test_a_process_nvml_does_not_list_has_no_own_figure() -> None:
    nvml = NvmlTestDouble(processes={0: [(999, GIB)]})  # another PID namespace, say
    _sampler, transport = _sample(nvml, 500, {"LOCAL_RANK": "0"})
    (sample,) = transport.samples("gpu")
    assert sample.process_memory_used_bytes is None and sample.memory_used_bytes == GIB
