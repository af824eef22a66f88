"""``python -m specexec``: the same command line as ``specexec``."""

from .cli import entry

entry()
