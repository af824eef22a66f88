"""Benchmarks for specexec (run as `python -m specexec.bench.<name>`)."""
