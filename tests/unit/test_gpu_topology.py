"""The topology readings from NVML, with the NVML test double."""

from __future__ import annotations

from nvml_double import NvmlTestDouble

from dsec.ingest.gpu_topology import read_topology


def test_numa_cpus_and_nvlink_are_read_per_gpu() -> None:
    first, second = read_topology(NvmlTestDouble(), "node-1", cpu_count=128)
    assert (first.gpu_uuid, first.gpu_index, first.node_id) == (
        "GPU-00000000-aaaa-bbbb", 0, "node-1")
    assert first.numa_node == 0 and first.cpu_affinity == [0, 1, 2, 3, 64, 65]
    assert second.numa_node == -1  # the driver has no NUMA id: left at -1, the rest read
    assert second.cpu_affinity == [4, 5, 6, 7]
    assert first.links == {second.gpu_uuid: "nvlink"} and first.nvlink_active == 2
    assert second.links == {first.gpu_uuid: "nvlink"}
    assert first.gpu_model == "NVIDIA H200"


def test_without_nvlink_the_pcie_common_ancestor_says_how_far() -> None:
    nvml = NvmlTestDouble()
    nvml.nvlink_active = False
    nvml.common_ancestor = 10
    first, _second = read_topology(nvml, "node-1", cpu_count=8)
    assert first.links == {"GPU-00000001-aaaa-bbbb": "pcie_switch"}
    assert first.nvlink_active == 0 and first.cpu_affinity == [0, 1, 2, 3]
