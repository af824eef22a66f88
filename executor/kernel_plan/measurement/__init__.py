"""Timing this machine: the store of measurements kept across runs, its lock, the start's journal, and
whether the CPUs were quiet for them."""
