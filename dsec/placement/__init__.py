"""Placement: where work goes, from GPU personalities, workload affinity, GPU health and
topology; served over HTTP, to kube-scheduler as an extender, and to Ray."""
