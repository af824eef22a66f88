"""q8_linear with float16 block scales against the same values in float32, one process, taking turns
(7 rounds, the median of 20 passes over five layers of the 0.5B's and SmolLM2's shapes, as 5-bit and as
int8 tiles, bfloat16 activations): ``python ab_scales.py``."""

import statistics
import time

import torch
from specexec.executor.layers.quantized.quantized_dot import pack_q5, pack_q8, q8_linear, tile_block_scales

torch.set_num_threads(2)
gen = torch.Generator().manual_seed(0)
shapes = [(4864, 896), (896, 4864), (1152, 896), (576 * 3, 576), (1536 * 2, 576)]
layers = []
for out_f, in_f in shapes:
    q = torch.randint(-16, 16, (out_f, in_f), generator=gen, dtype=torch.int8)
    s = (torch.rand(out_f, in_f // 32, generator=gen) * 0.01).half().float()
    layers.append((pack_q5(q, False), tile_block_scales(s), tile_block_scales(s).half(), in_f))
    layers.append((pack_q8(q), tile_block_scales(s), tile_block_scales(s).half(), in_f))
for rows in (1, 4, 8):
    xs = {in_f: torch.randn(rows, in_f).bfloat16() for *_, in_f in layers}
    res = {"f32": [], "f16": []}
    for rnd in range(7):
        for kind in ("f32", "f16") if rnd % 2 == 0 else ("f16", "f32"):
            t = time.perf_counter()
            for _ in range(20):
                for tiles, s32, s16, in_f in layers:
                    q8_linear(xs[in_f], tiles, s32 if kind == "f32" else s16)
            res[kind].append((time.perf_counter() - t) / 20 * 1000)
    a, b = statistics.median(res["f32"]), statistics.median(res["f16"])
    print(f"rows {rows}: f32 {a:.3f} ms, f16 {b:.3f} ms, ratio {b / a:.3f}")
