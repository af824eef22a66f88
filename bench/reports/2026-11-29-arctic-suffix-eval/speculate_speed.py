"""arctic-inference's SuffixDecodingCache on a 2,040-token prompt of repeated 12-token phrases: the time to
index the prompt and per `speculate` call (up to 8 tokens) as the response grows by 4 tokens a step
(``/tmp/arcvenv/bin/python speculate_speed.py`` after ``install.sh``)."""

import statistics
import time

import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache

rng = np.random.default_rng(0)
# a prompt with repeats (as extraction / code edits): 2k tokens drawn from 40 phrases of 12 tokens
phrases = rng.integers(0, 49152, (40, 12))
prompt = np.concatenate([phrases[i] for i in rng.integers(0, 40, 170)]).astype(np.int32)
cache = SuffixDecodingCache(max_tree_depth=64, max_cached_requests=1000)
t = time.perf_counter()
cache.start_request("r0", prompt)
start = time.perf_counter() - t
out = list(prompt[-8:])
times = []
drafted = 0
for _step in range(200):
    ctx = np.array(out[-64:], dtype=np.int32)
    t = time.perf_counter()
    d = cache.speculate("r0", ctx, max_spec_tokens=8)
    times.append(time.perf_counter() - t)
    drafted += len(d.token_ids)
    nxt = phrases[rng.integers(0, 40)][:4].astype(np.int32)
    cache.add_active_response("r0", nxt)
    out.extend(nxt)
print(
    f"start_request on {len(prompt)} tokens: {start * 1e3:.2f} ms; speculate median {statistics.median(times) * 1e6:.1f} us, p90 {sorted(times)[179] * 1e6:.1f} us; tokens drafted {drafted}"
)
