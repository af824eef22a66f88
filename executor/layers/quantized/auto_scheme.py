"""``quantization: auto`` for one model file: a GGUF runs at its own codes (``gguf``) wherever its int4
kernels run, anything else as loaded (None). Decided from the path and where and how the model will run,
before anything loads."""

from __future__ import annotations

from pathlib import Path

GGUF_MAGIC = b"GGUF"
QUANTIZATIONS = ("int8", "int4", "gguf")  #: the schemes `quantization.quantize_model` applies
#: what the ``quantization`` key takes (config, ``--quantization``): the schemes, auto and none
QUANTIZATION_SETTINGS = ("auto", "none", *QUANTIZATIONS)


def auto_scheme(path: Path, dtype: str, device: str, device_map) -> tuple[str | None, str]:
    """(``gguf`` or None, a line saying why) for the model at ``path`` loaded in ``dtype`` (a config
    value: ``auto`` included) on ``device`` ("cpu", "cuda", "cuda:1")."""
    if not is_gguf_file(path):
        return None, "none: auto: a dense checkpoint runs as loaded"
    if device_map is not None:
        return (
            None,
            "none: auto: device_map spreads the model over devices; GGUF codes run on one (dequantized)",
        )
    if dtype == "float64":
        return None, "none: auto: float64 (the reference dtype) runs the GGUF dequantized"
    if device.startswith("cuda") and dtype not in ("auto", "bfloat16"):
        return None, f"none: auto: the int4 kernels on CUDA run in bfloat16, not {dtype} (dequantized)"
    return "gguf", "gguf: auto: a GGUF file runs at its own codes (quantization: none dequantizes it)"


def is_gguf_file(path: Path) -> bool:
    """Whether ``path`` is a file that starts with GGUF's magic (a directory or a missing file is not)."""
    try:
        with Path(path).expanduser().open("rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False
