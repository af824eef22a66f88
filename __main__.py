"""``python -m specexec``: the same command line as ``specexec``."""

from .cli import main

raise SystemExit(main())
