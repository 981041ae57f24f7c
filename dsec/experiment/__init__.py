"""The goodput experiment: a simulated RL cluster with injected faults, run with dsec
acting and with dsec only observing, side by side (``dsec experiment goodput``)."""
