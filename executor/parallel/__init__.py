"""Tensor parallelism: the target's own decoder sharded over worker processes (`tp_runner.py`)."""
