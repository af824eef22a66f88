"""The training loop of `specexec train-eagle3`: batches of whole sequences under a token budget, the
training-time test loss (`ttt.py`) with a warm-up and cosine learning rate, held-out agreement checks
with early stopping, resumable checkpoints, and the loss curve."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch

from ...training.precision import TrainingPrecision
from .checkpoint import (
    TrainingState,
    save_checkpoint,
)
from .ttt import Batch, ttt_loss


def _batches(feats, batch_tokens: int, max_len: int, rng: random.Random):
    """Groups of sequences of similar length, about ``batch_tokens`` positions each, in random order."""
    order = sorted(range(len(feats)), key=lambda i: (len(feats[i].token_ids), rng.random()))
    groups, group, longest = [], [], 0
    for i in order:
        n = min(len(feats[i].aux) - 1, max_len)
        if group and max(longest, n) * (len(group) + 1) > batch_tokens:
            groups.append(group)
            group, longest = [], 0
        group.append(i)
        longest = max(longest, n)
    if group:
        groups.append(group)
    rng.shuffle(groups)
    return groups


def make_batch(feats, lm_rows: torch.Tensor, in_draft: torch.Tensor, max_len: int) -> Batch:
    """Index i of a sequence: features at its position, the next token, the target's log-probs (over
    the draft vocabulary) of the token after that. An index counts when the token after that belongs to
    the answer and (the target's greedy choice, in its own greedy answers) is in the draft vocabulary."""
    t = max(min(len(f.aux) - 1, max_len) for f in feats)
    b, device = len(feats), lm_rows.device  # the features are on it too (`load_features`)
    aux = torch.zeros(b, t, feats[0].aux.shape[1], device=device)
    next_ids = torch.zeros(b, t, dtype=torch.long, device=device)
    positions = torch.zeros(b, t, dtype=torch.long, device=device)
    final = torch.zeros(b, t, feats[0].final.shape[1], device=device)
    valid = torch.zeros(b, t, dtype=torch.bool, device=device)
    real = torch.zeros(b, t, dtype=torch.bool, device=device)
    answers = torch.zeros(b, t, dtype=torch.bool, device=device)
    for j, f in enumerate(feats):
        n = min(len(f.aux) - 1, max_len)
        aux[j, :n] = f.aux[:n].float()
        next_ids[j, :n] = f.token_ids[1 : n + 1]
        positions[j, :n] = torch.arange(f.start_pos, f.start_pos + n, device=device)
        final[j, :n] = f.final[1 : n + 1].float()
        answer = torch.arange(f.start_pos + 2, f.start_pos + n + 2, device=device) >= f.answer_start  # [n]
        valid[j, :n] = in_draft[f.token_ids[2 : n + 2]] & answer
        answers[j, :n] = answer
        real[j, :n] = True
    with torch.no_grad():
        target_logits = final @ lm_rows.T  # [B, T, draft_vocab]
        target_probs = torch.softmax(target_logits, dim=-1)
    return Batch(
        aux, next_ids, positions, target_probs, target_logits.argmax(-1), valid & real, real, answers
    )


def train_head(
    head,
    train,
    val,
    lm_rows,
    in_draft,
    args,
    budget_s: float,
    checkpoint=None,
    checkpoint_path=None,
    val_key: str = "",
) -> dict:
    """Train until the budget ends or validation stops improving (``--patience`` evaluations without a
    better estimated acceptance length); evaluated every ``--eval-every`` steps and after each epoch,
    with a checkpoint each time; a ``checkpoint`` from an earlier run is continued. If the validation
    split changed since (``val_key``: the corpus grew), the best head so far and the current one are
    scored again on the new split before training goes on, so that "best" compares like with like. The
    head ends with the weights of its best evaluation."""
    from tqdm import tqdm

    rng = random.Random(args.seed + (checkpoint["state"].step if checkpoint else 0))
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    state, best = (checkpoint["state"], checkpoint["best_head"]) if checkpoint else (TrainingState(), None)
    if checkpoint:
        opt.load_state_dict(checkpoint["optimizer"])
    log = state.log
    log["args"] = {k: v for k, v in vars(args).items() if k != "func"}
    log["runs"].append(
        {"first_step": state.step + 1, "train_sequences": len(train), "val_sequences": len(val)}
    )
    draft_ids = head.t2d.nonzero()[:, 0]  # [draft_vocab] sorted target ids, kept in the checkpoint
    precision = TrainingPrecision(args.train_dtype, lm_rows.device.type)
    start, run_step, est_total, stop = time.perf_counter(), 0, None, None
    earlier_seconds = log.get("train_seconds", 0.0)  # of the runs before this one

    def validate() -> None:
        nonlocal best, stop
        result = evaluate(head, val, lm_rows, in_draft, args)
        log["val"].append({"step": state.step, **result})
        if result["est_acceptance_length"] > state.best_score:
            state.best_score, state.best_step, state.evals_without_gain = (
                result["est_acceptance_length"],
                state.step,
                0,
            )
            best = {k: v.detach().clone() for k, v in head.state_dict().items()}
        else:
            state.evals_without_gain += 1
            if state.evals_without_gain >= args.patience:
                stop = "validation stopped improving"
        log["train_seconds"] = earlier_seconds + time.perf_counter() - start  # kept with the checkpoint
        if checkpoint_path is not None:
            save_checkpoint(checkpoint_path, head, opt, state, draft_ids, best)

    split_changed = checkpoint is not None and state.val_key != val_key
    state.val_key = val_key
    if checkpoint is None and args.init_from:  # the head to beat is the one training starts from
        validate()
    elif split_changed:  # scores measured on another validation split do not compare
        state.best_score, state.evals_without_gain = 0.0, 0
        if best is not None:
            current = {k: v.detach().clone() for k, v in head.state_dict().items()}
            head.load_state_dict(best)
            best = None
            validate()
            head.load_state_dict(current)
        validate()
    bar = tqdm(total=round(budget_s), desc="training (s)", unit="s")
    while stop is None:
        for group in _batches(train, args.batch_tokens, args.max_len, rng):
            elapsed = time.perf_counter() - start
            if elapsed >= budget_s:
                stop = "time budget"
                break
            if run_step == 20:  # this run's schedule length from the measured step time
                est_total = state.step + int(budget_s / (elapsed / 20))
            lr = _lr(state.step, est_total, args.lr, first=state.step - run_step)
            for g in opt.param_groups:
                g["lr"] = lr
            batch = make_batch([train[i] for i in group], lm_rows, in_draft, args.max_len)
            mode, step_started = precision.next(), time.perf_counter()
            with precision.autocast(mode):
                loss, losses, agree = ttt_loss(head, batch, args.ttt_steps)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            precision.record(mode, time.perf_counter() - step_started, int(batch.real.sum()))
            state.step += 1
            run_step += 1
            log["steps"].append(
                {
                    "step": state.step,
                    "t": round(elapsed, 1),
                    "lr": lr,
                    "loss": losses,
                    "agree": agree,
                    "dtype": mode,
                }
            )
            bar.n = round(elapsed)
            bar.set_postfix(
                epoch=state.epoch, step=state.step, loss=f"{losses[0]:.3f}", agree0=f"{agree[0]:.2f}"
            )
            if state.step % args.eval_every == 0:
                validate()
                if stop:
                    break
        else:
            state.epoch += 1
            validate()
    bar.close()
    if not log["val"] or log["val"][-1]["step"] != state.step:
        validate()
    if best is not None:
        head.load_state_dict(best)
    log.update(epochs=state.epoch, stopped=stop, best_step=state.best_step, precision=precision.summary())
    log["train_seconds"] = earlier_seconds + time.perf_counter() - start
    print(f"stopped: {stop}; best held-out estimate {state.best_score:.2f} at step {state.best_step}")
    print(f"training precision: {precision.chosen} ({precision.reason})")
    return log


@torch.no_grad()
def evaluate(head, val, lm_rows, in_draft, args) -> dict:
    head.eval()
    sums, counts = None, 0
    for j in range(0, len(val), 8):
        batch = make_batch(val[j : j + 8], lm_rows, in_draft, args.max_len)
        _, losses, agree = ttt_loss(head, batch, args.ttt_steps)
        sums = [a + b for a, b in zip(sums, agree + losses)] if sums else agree + losses
        counts += 1
    head.train()
    k = args.ttt_steps
    agree = [round(s / counts, 4) for s in sums[:k]]
    # a rough acceptance length at draft length k: 1 + a0 + a0*a1 + ...
    length, run = 1.0, 1.0
    for a in agree:
        run *= a
        length += run
    return {"agree": agree, "loss": [round(s / counts, 4) for s in sums[k:]], "est_acceptance_length": length}


def _lr(step: int, total: int | None, peak: float, warmup: int = 30, first: int = 0) -> float:
    """Linear warm-up over the first ``warmup`` steps ever, then a cosine from ``first`` (this run's
    first step) to ``total`` (its estimated last), down to a tenth."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if total is None:
        return peak
    begin = max(first, warmup)
    frac = min(1.0, (step - begin) / max(1, total - begin))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def write_loss_curve(log: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    steps = [s["step"] for s in log["steps"]]
    for k in range(len(log["steps"][0]["loss"]) if steps else 0):
        ax[0].plot(steps, [s["loss"][k] for s in log["steps"]], label=f"step {k}", lw=0.8)
        ax[1].plot(
            [v["step"] for v in log["val"]],
            [v["agree"][k] for v in log["val"]],
            marker="o",
            label=f"step {k}",
        )
    ax[0].set(xlabel="optimizer step", ylabel="soft cross-entropy (train)", title="EAGLE-3 training loss")
    ax[1].set(xlabel="optimizer step", ylabel="top-1 agreement with the target", title="held-out agreement")
    for a in ax:
        if a.lines:
            a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
