"""Timing this machine: the measurements kept across runs and whether the CPUs were quiet for them."""
