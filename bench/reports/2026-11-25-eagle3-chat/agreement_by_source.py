"""Where a head agrees with the target: teacher-forced step-0 agreement on answer positions, by source.

    python bench/reports/2026-11-25-eagle3-chat/agreement_by_source.py [HEAD_DIR] [WORK_DIR]

The target's greedy answers (128 tokens) to the 16 Spec-Bench and 16 extraction prompts the head
evaluation uses (held out), and the validation split of the corpus in .train/smollm2-eagle3, grouped
by source (a trailing ~s: sampled answers). Per group: how often the head's top draft equals the
target's token (every answer position, tokens outside the draft vocabulary counting as misses), the
draft vocabulary's coverage of those tokens, and calibration: per confidence bin, count and agreement.
A one-off diagnosis, not part of the package; answers are cached in WORK_DIR (default /tmp/diag).
"""

import sys
from collections import defaultdict
from pathlib import Path

import torch
from specexec.drafters.eagle3.head import SHIPPED_HEAD, load_head
from specexec.drafters.eagle3.training.checkpoint import split_records
from specexec.drafters.eagle3.training.corpus import generate_corpus, read_corpus
from specexec.drafters.eagle3.training.features import load_features
from specexec.drafters.eagle3.training.ttt import ChainAttention
from specexec.executor.model.model_loader import load_model
from specexec.prompt_sets.datasets import load_dataset

head_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else SHIPPED_HEAD
out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/diag")
target = load_model(None, dtype="float32", progress=False).model
head = load_head(head_dir, target.get_input_embeddings(), torch.float32, "cpu")
cfg = head.config
layers = (*cfg.aux_layer_ids, target.config.num_hidden_layers)
H = cfg.target_hidden_size
sets = {}
for name in ("specbench", "extraction"):
    p = out / name / "corpus.jsonl"
    recs = generate_corpus(
        p,
        layers,
        num_prompts=16,
        max_tokens=128,
        keep_positions=641,
        prompts=load_dataset(name, 16),
        max_batch_size=16,
    )
    sets[name] = (recs, out / name)
corpus = Path(".train/smollm2-eagle3/corpus")
_, val = split_records(read_corpus(corpus / "corpus.jsonl"))
by_src = defaultdict(list)
for r in val:
    source = "self-instruct" if r["id"].startswith("si-") else r["id"].split("/")[0].split(":")[0]
    if source.startswith(("simple_python", "multiple_", "parallel_", "live_")):
        source = "bfcl"
    by_src["val:" + source + ("~s" if r["id"].endswith("~s") else "")].append(r)
for k, v in by_src.items():
    sets[k] = (v, corpus)


@torch.no_grad()
def agreement(recs, d):
    feats = load_features(recs, d, H)
    hit = tot = cov = 0
    confs, oks = [], []
    for f in feats:
        n = len(f.aux) - 1
        ids = f.token_ids
        attend = ChainAttention(1, n, torch.ones(1, n, dtype=torch.bool))
        hidden = head.fuse(f.aux[:n].float())
        pos = torch.arange(f.start_pos, f.start_pos + n)
        o = head.step(ids[1 : n + 1], hidden, pos, attend)
        logits = head.logits(o).float()
        p = logits.softmax(-1)
        c, a = p.max(-1)
        pred = head.to_target_ids(a)
        want = ids[2 : n + 2]
        ans = torch.arange(f.start_pos + 2, f.start_pos + n + 2) >= f.answer_start
        ok = (pred == want)[ans]
        hit += int(ok.sum())
        tot += int(ans.sum())
        cov += int(head.t2d[want[ans]].sum())
        confs.append(c[ans])
        oks.append(ok)
    c = torch.cat(confs)
    ok = torch.cat(oks).float()
    bins = [(lo, (c >= lo) & (c < lo + 0.2)) for lo in (0, 0.2, 0.4, 0.6, 0.8)]
    cal = " ".join(f"[{lo:.1f}:{int(m.sum())} {ok[m].mean():.2f}]" for lo, m in bins if m.any())
    return hit / tot, cov / tot, tot, cal


for k, (recs, d) in sets.items():
    a, cov, tot, cal = agreement(recs, d)
    print(f"{k:28} n={tot:6}  step0 agree {a:.3f}  draft-vocab coverage {cov:.3f}  calib {cal}")
