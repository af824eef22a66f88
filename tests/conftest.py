"""Lets the test modules import the `tiny_models` helper next to them."""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import torch  # noqa: E402

# The tiny test models are far faster on one thread; several threads on a busy 2-core machine
# spend their time contending with each other.
torch.set_num_threads(1)
