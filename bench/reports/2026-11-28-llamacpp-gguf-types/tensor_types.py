"""Tensor types of GGUF files, per kind of tensor (gguf-py). A record for this report, not library code:

python3 bench/reports/2026-11-28-llamacpp-gguf-types/tensor_types.py FILE...
"""

import collections
import re
import sys

import gguf

for path in sys.argv[1:]:
    reader = gguf.GGUFReader(path)
    by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for tensor in reader.tensors:
        by_kind[re.sub(r"^blk\.\d+\.", "", tensor.name)][tensor.tensor_type.name] += 1
    print(f"{path.rsplit('/', 1)[-1]} (general.file_type {reader.fields['general.file_type'].contents()}):")
    print("  all:", dict(collections.Counter(t.tensor_type.name for t in reader.tensors)))
    for kind, counts in sorted(by_kind.items()):
        print(f"  {kind}: {dict(counts)}")
