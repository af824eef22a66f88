"""Grammar-mask kernels for guided decoding (xgrammar-style packed token bitmasks).

``apply_mask_inplace`` sets the logits of disallowed tokens to -inf in place, through the CuPy
CUDA kernel (``apply_mask.cu``) or the vectorised torch path. A leaf package: it imports
nothing else from specexec, and CuPy only when the CUDA path runs.
"""

from .apply_mask_cupy import apply_mask_inplace_cupy
from .apply_mask_torch import apply_mask_inplace_torch
from .dispatch import BACKENDS, apply_mask_inplace, cupy_available

__all__ = [
    "BACKENDS",
    "apply_mask_inplace",
    "apply_mask_inplace_cupy",
    "apply_mask_inplace_torch",
    "cupy_available",
]
