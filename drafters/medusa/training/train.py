"""`specexec train-medusa`: train Medusa heads for a target on this machine (``--device``: its GPU when it
has one, else its CPU).

    specexec train-medusa --output heads/smollm2-medusa --max-minutes 40

1. the corpus: the one EAGLE-3's training builds too (`drafters/training/corpus.py`), with the target's
   final hidden state captured: the greedy answers of the token archive (the one bundled for the default model, in
   a fixed shuffled order) prefilled, then the target's greedy answers to bundled prompts no benchmark
   draw can pick, appended to ``<output>/corpus/corpus.jsonl`` (a rerun continues it);
2. the draft vocabulary: the corpus's most frequent tokens; the heads start as the target's LM head
   over it (`heads.new_heads`);
3. training (`data.py` says what each head learns) until the time budget ends or validation stops
   improving, with a progress bar and a held-out check of each head's top-1 agreement and of the chain's
   estimated acceptance length; ``training_log.json``;
4. the best heads, fp16, in ``<output>`` (``config.json``, ``model.safetensors``).

Training starts over on a rerun (its corpus does not): the heads are small and train in minutes.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ...training.archive import open_archive
from ...training.draft_vocab import choose_draft_vocab, d2t_for
from ...training.machine import training_device
from ...training.precision import TrainingPrecision
from ...training.validation_split import split_records
from ..heads import MAX_HEADS, MedusaConfig, MedusaHeads, new_heads, save_heads
from .data import IGNORE, MedusaRows, draft_index, is_greedy, load_rows

WARMUP_STEPS = 50
EVAL_ROWS = 20_000  #: validation positions scored at most


def train(args) -> int:
    """The whole pipeline of `specexec train-medusa` (see the module docstring)."""
    from ....executor.model.model_loader import load_model
    from ...training.bundled_prompts import training_prompts
    from ...training.corpus import generate_corpus

    _check_args(args)
    device = training_device(args.device)
    started = time.perf_counter()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    target = load_model(args.model, dtype="float32", progress=False).model
    tc = target.config.get_text_config()
    archive = open_archive(args, target)
    archived = None
    if archive is not None:
        archived = [a for a in archive.answers() if is_greedy(a)]
        random.Random(args.seed).shuffle(archived)  # any prefix a time budget cuts is a mix of the sets
        print(f"archive {archive.root}: {len(archived)} greedy answers")
    records = generate_corpus(
        out / "corpus" / "corpus.jsonl",
        (tc.num_hidden_layers,),
        num_prompts=args.num_prompts,
        max_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        max_seconds=args.corpus_minutes * 60,
        keep_positions=args.max_new_tokens + 1,
        model=args.model,
        prompts=training_prompts(),
        archived=archived,
        device=str(device),
    )
    if not records:
        raise ValueError("the corpus is empty: no answer was generated")
    eos = target.generation_config.eos_token_id if target.generation_config is not None else None
    always = tuple(eos if isinstance(eos, list) else [eos or 0])
    draft_ids = choose_draft_vocab(records, args.draft_vocab_size, tc.vocab_size, always)
    t2d = draft_index(draft_ids, tc.vocab_size)
    train_records, val_records = split_records(records)
    train_rows = load_rows(train_records, out / "corpus", args.num_heads, t2d)
    val_rows = load_rows(val_records, out / "corpus", args.num_heads, t2d)
    print(f"corpus: {len(records)} answers, {len(train_rows)} training positions, {len(val_rows)} held out")
    cfg = MedusaConfig(tc.hidden_size, tc.vocab_size, len(draft_ids), args.num_heads)
    lm_rows = target.get_output_embeddings().weight[draft_ids].detach()  # [draft_vocab, hidden]
    heads = new_heads(cfg, lm_rows, d2t_for(draft_ids)).to(device)
    del target
    left = args.max_minutes * 60 - (time.perf_counter() - started)
    log = train_heads(heads, train_rows, val_rows, args, budget_s=left - min(20.0, 0.1 * left))
    log.update(
        corpus_answers=len(records),
        train_positions=len(train_rows),
        val_positions=len(val_rows),
        total_minutes=(time.perf_counter() - started) / 60,
    )
    save_heads(heads.cpu(), out)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"wrote the heads to {out} ({log['total_minutes']:.1f} min): {log['best']}")
    return 0


def _check_args(args) -> None:
    if (
        args.max_minutes <= 0
        or args.corpus_minutes < 0
        or not 1 <= args.num_heads <= MAX_HEADS
        or args.draft_vocab_size < 1
        or args.batch_size < 1
        or args.eval_every < 1
        or args.patience < 1
        or args.lr <= 0
        or not 0 < args.head_decay <= 1
    ):
        raise ValueError(
            f"--max-minutes > 0, --corpus-minutes >= 0, --num-heads in 1..{MAX_HEADS}, --draft-vocab-size "
            ">= 1, --batch-size >= 1, --eval-every >= 1, --patience >= 1, --lr > 0, --head-decay in (0, 1]"
        )


def train_heads(heads: MedusaHeads, train: MedusaRows, val: MedusaRows, args, budget_s: float) -> dict:
    """AdamW on the heads' cross-entropy (head k weighted ``head_decay ** k``) under a time-based cosine
    learning rate, until ``budget_s`` ends or ``--patience`` validations bring no better estimated
    acceptance length; the heads end with the weights of their best validation."""
    from tqdm import tqdm

    device = heads.lm_head.weight.device
    opt = torch.optim.AdamW(heads.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    weights = torch.tensor([args.head_decay**k for k in range(heads.config.num_heads)], device=device)
    precision = TrainingPrecision(args.train_dtype, device.type)
    generator = torch.Generator().manual_seed(args.seed)
    log: dict = {"args": {k: v for k, v in vars(args).items() if k != "func"}, "steps": [], "val": []}
    best = evaluate(heads, val)
    log["val"].append({"step": 0, **best})
    best_state = {k: v.clone() for k, v in heads.state_dict().items()}
    start, step, evals_without_gain, stop = time.perf_counter(), 0, 0, None
    bar = tqdm(total=round(budget_s), desc="training (s)", unit="s")
    while stop is None:
        order = torch.randperm(len(train), generator=generator)
        for first in range(0, len(order), args.batch_size):
            elapsed = time.perf_counter() - start
            if elapsed > budget_s:
                stop = "time budget"
                break
            step += 1
            for group in opt.param_groups:
                group["lr"] = (
                    args.lr
                    * min(1.0, step / WARMUP_STEPS)
                    * 0.5
                    * (1 + math.cos(math.pi * elapsed / budget_s))
                )
            idx = order[first : first + args.batch_size]
            kind = precision.next()
            step_started = time.perf_counter()
            loss = _loss(
                heads, train.hidden[idx].to(device), train.labels[idx].to(device), weights, precision, kind
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            precision.record(kind, time.perf_counter() - step_started, len(idx))
            bar.update(round(time.perf_counter() - start) - bar.n)
            if step % 20 == 0:
                value = loss.item()
                log["steps"].append({"step": step, "loss": round(value, 4)})
                bar.set_postfix(loss=f"{value:.3f}", best=f"{best['est_acceptance_length']:.3f}")
            if step % args.eval_every == 0:
                result = evaluate(heads, val)
                log["val"].append({"step": step, **result})
                if result["est_acceptance_length"] > best["est_acceptance_length"]:
                    best, evals_without_gain = result, 0
                    best_state = {k: v.clone() for k, v in heads.state_dict().items()}
                else:
                    evals_without_gain += 1
                    if evals_without_gain >= args.patience:
                        stop = "validation stopped improving"
                        break
    bar.close()
    result = evaluate(heads, val)
    log["val"].append({"step": step, **result})
    if result["est_acceptance_length"] > best["est_acceptance_length"]:
        best, best_state = result, heads.state_dict()
    heads.load_state_dict(best_state)
    log.update(
        stop=stop,
        steps_run=step,
        best=best,
        precision=precision.summary(),
        train_seconds=time.perf_counter() - start,
    )
    return log


def _loss(heads, hidden, labels, weights, precision, kind) -> torch.Tensor:
    """Weighted mean over heads of each head's cross-entropy on its labelled rows."""
    with precision.autocast(kind):
        logits = heads(hidden.float())  # [B, K, draft_vocab]
    per_head = [
        F.cross_entropy(logits[:, k].float(), labels[:, k], ignore_index=IGNORE, reduction="sum")
        / (labels[:, k] != IGNORE).sum().clamp(min=1)
        for k in range(logits.shape[1])
    ]
    return (torch.stack(per_head) * weights).sum() / weights.sum()


@torch.no_grad()
def evaluate(heads: MedusaHeads, val: MedusaRows, batch_size: int = 2048) -> dict:
    """Each head's top-1 agreement with the target's greedy token on the held-out positions, and the
    chain's estimated acceptance length: 1 + the mean number of leading heads that agree (a label
    outside the draft vocabulary counts as a miss)."""
    device = heads.lm_head.weight.device
    n = min(len(val), EVAL_ROWS)
    hits = []
    for first in range(0, n, batch_size):
        hidden = val.hidden[first : min(n, first + batch_size)].to(device).float()
        labels = val.labels[first : min(n, first + batch_size)].to(device)
        hits.append(heads(hidden).argmax(dim=-1) == labels)  # [b, K]
    hit = torch.cat(hits).float()  # [n, K]
    leading = hit.cumprod(dim=1).sum(dim=1)  # [n]
    return {
        "top1_per_head": [round(float(v), 4) for v in hit.mean(dim=0)],
        "est_acceptance_length": round(1 + float(leading.mean()), 4),
    }
