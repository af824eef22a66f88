"""One load of a GGUF under ``quantization: gguf`` in a fresh process: seconds, peak resident memory and
the cache folder's size, as one JSON line (``python load_once.py FILE CACHE_DIR``)."""

import json
import resource
import sys
import time
from pathlib import Path

from specexec.executor.model.model_loader import load_model

start = time.perf_counter()
loaded = load_model(
    sys.argv[1],
    dtype="float32",
    quantization="gguf",
    model_impl="specexec",
    quantized_kernel="auto",
    cache_dir=sys.argv[2],
    progress=False,
)
seconds = time.perf_counter() - start
cache = sum(f.stat().st_size for f in Path(sys.argv[2]).rglob("*") if f.is_file())
print(
    json.dumps(
        {
            "file": Path(sys.argv[1]).name,
            "converted": "converted now" in loaded.source,
            "load_s": round(seconds, 2),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "cache_mib": round(cache / 2**20, 1),
            "weights_mib": round(loaded.quantization.weight_bytes / 2**20),
        }
    )
)
