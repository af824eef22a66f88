"""`specexec ...` with match_rows taking -0.0 and +0.0 as equal: a check of why the Q4_0 file is refused,
not a fix (the fix belongs in executor/layers/quantized/gguf_weights.py). A record for this report:

python3 bench/reports/2026-11-28-llamacpp-gguf-types/run_patched.py run --model FILE --quantization gguf ...
"""

import sys

from specexec.cli import main
from specexec.executor.layers.quantized import gguf_weights, quantization

original = gguf_weights.match_rows


def match_rows(stored, converted, name):
    return original(stored + 0.0, converted.detach() + 0.0, name)  # x + 0.0 turns -0.0 into +0.0


quantization.match_rows = match_rows
sys.exit(main(sys.argv[1:]))
