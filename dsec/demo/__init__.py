"""The simulated training cluster: small real RL trainers with the dsec probe, on CPU."""
