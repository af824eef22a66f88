"""`specexec train-eagle3`: train an EAGLE-3 head for a target on this machine (``--device``: its GPU
when it has one, else its CPU).

    specexec train-eagle3 --output heads/smollm2 --max-minutes 60

1. the corpus (`drafters/training/corpus.py`): the target's greedy answers to bundled prompts no
   benchmark draw can pick (`drafters/training/bundled_prompts.py`), to the self-instruct pool
   (`prompts`) and to document tasks (`documents`), appended to ``<output>/corpus.jsonl`` (a rerun
   continues it); answers the token archive holds (`drafters/training/archive.py`) are restored by
   prefill, new ones are added to it;
2. the draft vocabulary: the corpus's most frequent tokens (`drafters/training/draft_vocab.py`); the
   target's features over the corpus;
3. the training-time test (`ttt`) until the time budget ends, with a progress bar, a held-out
   agreement check, and ``training_log.json`` + ``loss_curve.png``;
4. the head in the published layout (``config.json``, fp16 ``model.safetensors`` with d2t/t2d).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from ...training.archive import CorpusArchive, open_archive
from ...training.draft_vocab import choose_draft_vocab, d2t_for
from ...training.machine import training_device
from ...training.validation_split import split_records, validation_key
from ..head import SHIPPED_HEAD, Eagle3Config, Eagle3Head, default_aux_layers, load_head, save_head
from .checkpoint import CHECKPOINT_NAME, load_checkpoint
from .reshape import trainable, with_draft_vocab, with_mlp_width
from .train_loop import train_head, write_loss_curve

#: the window a new head attends (``--sliding-window``): the shipped head, trained on 640-position
#: sequences, drafted 1.1k-3.2k-token extraction prompts at acceptance length 2.81 with 512, 2.83 with
#: 256 and 2.59 over the whole context; open chat (shorter prompts) was alike at 256 to full
DEFAULT_SLIDING_WINDOW = 512


def train(args) -> int:
    """The whole pipeline of `specexec train-eagle3` (see the module docstring)."""
    from ....executor.model.model_loader import load_model
    from ...training.bundled_prompts import training_prompts
    from ...training.corpus import corpus_size, generate_corpus
    from .features import load_features
    from .prompts import mix_prompts, pool_prompts

    if args.sliding_window is None:
        args.sliding_window = min(DEFAULT_SLIDING_WINDOW, args.max_len)
    if (
        args.max_minutes <= 0
        or args.corpus_minutes < 0
        or args.ttt_steps < 1
        or args.draft_vocab_size < 1
        or args.eval_every < 1
        or args.patience < 1
        or not 0 <= args.pool_share <= 1
        or args.document_tasks < 0
        or (args.fresh_vocab and not args.init_from)
        or (args.mlp_width is not None and args.mlp_width < 1)
        or not 0 <= args.sliding_window <= args.max_len
        or 0 < args.sliding_window <= args.ttt_steps  # (the unrolled steps' own keys must lie inside it)
    ):
        raise ValueError(
            "--max-minutes > 0, --corpus-minutes >= 0, --ttt-steps >= 1, --draft-vocab-size >= 1, "
            "--eval-every >= 1, --patience >= 1, --pool-share in 0..1, --document-tasks >= 0, "
            "--fresh-vocab only with --init-from, --mlp-width >= 1, --sliding-window 0 or in --ttt-steps + 1..--max-len"
        )
    device = training_device(args.device)
    started = time.perf_counter()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    loaded = load_model(args.model, dtype="float32", progress=False)
    target = loaded.model
    cfg = _head_config(target.config, args.draft_vocab_size, args.mlp_width)
    start_head = _start_head(args.init_from, cfg, target) if args.init_from else None
    if start_head is not None and args.mlp_width is not None:
        start_head = with_mlp_width(start_head, args.mlp_width, args.seed)
    if start_head is not None and not args.fresh_vocab:  # its draft vocabulary comes with it
        cfg = start_head.config
    elif start_head is not None:
        cfg = replace(start_head.config, draft_vocab_size=cfg.draft_vocab_size)
    corpus_started = time.perf_counter()
    pool_path = out / "corpus" / "prompt_pool.jsonl"
    archive = open_archive(args, target)
    if archive is not None:
        print(f"archive {archive.root}: {archive.restore_pool(pool_path)} instructions restored")
    pool = _grow_pool(args, pool_path, device)
    archived = archive.answers() if archive is not None else None
    documents = _document_prompts(args, archived, pool, loaded.tokenizer, out / "corpus" / "corpus.jsonl")
    records = generate_corpus(
        out / "corpus" / "corpus.jsonl",
        (*cfg.aux_layer_ids, target.config.num_hidden_layers),
        num_prompts=args.num_prompts,
        max_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        max_seconds=args.corpus_minutes * 60 - (time.perf_counter() - corpus_started),
        keep_positions=args.max_len + 1,
        model=args.model,
        # the pool's side: its instructions and the document tasks in turn, a document task first
        prompts=mix_prompts(
            training_prompts(), mix_prompts(pool_prompts(pool), documents, 0.5), args.pool_share
        ),
        sampled_temperature=args.sampled_temperature,
        archived=archived,
        device=str(device),
    )
    if archive is not None:
        _export(archive, records, pool_path)
    if not records:
        raise ValueError("the corpus is empty: no answer was generated")
    size = {**corpus_size(records, out / "corpus"), "prompt_pool": len(pool)}
    (out / "corpus" / "size.json").write_text(json.dumps(size, indent=1) + "\n")
    print(
        f"corpus: {size['sequences']} sequences ({size['sampled_sequences']} sampled), {size['positions']} "
        f"positions, {size['feature_bytes'] / 2**20:.0f} MiB of features; prompt pool {len(pool)}"
    )
    if args.corpus_only:
        return 0
    checkpoint = load_checkpoint(out / CHECKPOINT_NAME)
    if checkpoint is not None:  # the vocabulary the head was trained with
        draft_ids = checkpoint["draft_ids"]
        if len(draft_ids) != cfg.draft_vocab_size:
            raise ValueError(
                f"{out / CHECKPOINT_NAME} holds a head with a {len(draft_ids)}-token draft vocabulary: pass "
                f"--draft-vocab-size {len(draft_ids)}, or another --output to start over"
            )
        width = checkpoint["head"]["midlayer.mlp.down_proj.weight"].shape[1]
        if width != cfg.intermediate_size:
            raise ValueError(
                f"{out / CHECKPOINT_NAME} holds a head with {width} MLP units: pass --mlp-width {width}, or "
                "another --output to start over"
            )
    elif start_head is not None and not args.fresh_vocab:
        draft_ids = start_head.t2d.nonzero()[:, 0]
    else:
        eos = target.generation_config.eos_token_id
        always = tuple(eos if isinstance(eos, list) else [eos or 0])
        draft_ids = choose_draft_vocab(records, cfg.draft_vocab_size, cfg.vocab_size, always)
    train_records, val_records = split_records(records)
    train = load_features(train_records, out / "corpus", cfg.target_hidden_size, device)
    val = load_features(val_records, out / "corpus", cfg.target_hidden_size, device)
    lm_rows = target.get_output_embeddings().weight[draft_ids].detach().to(device)  # [draft_vocab, hidden]
    if start_head is not None and not torch.equal(start_head.t2d.nonzero()[:, 0], draft_ids):
        start_head = with_draft_vocab(start_head, draft_ids, target.get_output_embeddings().weight.detach())
    in_draft = torch.zeros(cfg.vocab_size, dtype=torch.bool, device=device)
    in_draft[draft_ids.to(device)] = True
    head = start_head if start_head is not None else _init_head(cfg, target, draft_ids, lm_rows.cpu())
    if checkpoint is not None:
        head.load_state_dict(checkpoint["head"])
    head.config = replace(head.config, sliding_window=args.sliding_window or None)
    head = _head_to(head, device)
    del target
    left = args.max_minutes * 60 - (time.perf_counter() - started)
    budget = left - min(30.0, 0.1 * left)  # keep time to evaluate and save
    log = train_head(
        head,
        train,
        val,
        lm_rows,
        in_draft,
        args,
        budget,
        checkpoint,
        out / CHECKPOINT_NAME,
        val_key=validation_key(val_records),
    )
    log.update(
        corpus_records=len(records),
        corpus_output_tokens=sum(len(r["output_token_ids"]) for r in records),
        train_positions=sum(len(f.aux) - 1 for f in train),
        total_minutes=(time.perf_counter() - started) / 60,
    )
    save_head(_head_to(head, torch.device("cpu")), out)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    write_loss_curve(log, out / "loss_curve.png")
    print(f"wrote the head to {out} ({log['total_minutes']:.1f} min)")
    return 0


def _head_to(head: Eagle3Head, device: torch.device) -> Eagle3Head:
    """The head and the target embeddings it shares (not its submodule) on ``device``."""
    head.to(device)
    if head._target_embeddings[0] is not None:
        head._target_embeddings[0].to(device)
    return head


def _export(archive: CorpusArchive, records: list[dict], pool_path: Path) -> None:
    """Add the new answers and instructions to the archive; a read-only archive (an installed package)
    is reported, not fatal: the corpus in --output keeps them."""
    from .prompts import read_pool

    try:
        counts = archive.export(records, read_pool(pool_path))
    except OSError as e:
        print(f"archive {archive.root}: not updated ({e})")
        return
    print(f"archive {archive.root}: added {counts['answers']} answers, {counts['instructions']} instructions")


def _document_prompts(args, archived: list[dict] | None, pool, tokenizer, corpus_path: Path) -> list:
    """``--document-tasks`` prompts (`documents`), their documents the ``archived`` answers (or,
    without an archive, the corpus's)."""
    from ...training.bundled_prompts import bench_prompt_ids
    from ...training.corpus import read_corpus
    from .documents import document_prompts

    if args.document_tasks == 0:
        return []
    if tokenizer is None:
        raise ValueError("--document-tasks needs the target's tokenizer to turn its answers into documents")
    answers = archived if archived is not None else read_corpus(corpus_path)
    decode = partial(tokenizer.decode, skip_special_tokens=True)
    prompts = document_prompts(answers, pool, decode, bench_prompt_ids("extraction"))
    print(f"document tasks: {min(args.document_tasks, len(prompts))} of the {len(prompts)} buildable")
    return prompts[: args.document_tasks]


def _grow_pool(args, path: Path, device: torch.device) -> list[dict]:
    """The self-instruct pool (`prompts`), grown toward ``--self-instruct`` instructions for up
    to a third of the corpus time; what is already in the file is kept."""
    from ....executor.config import ExecutorConfig
    from ....executor.executor import Executor
    from .prompts import executor_generator, grow_pool, read_pool

    pool = read_pool(path)
    seconds = min(args.pool_minutes, args.corpus_minutes / 3) * 60
    if args.self_instruct <= len(pool) or seconds <= 0:
        return pool[: max(args.self_instruct, 0)]
    config = ExecutorConfig(model=args.model, max_batch_size=64, progress=False, device=str(device))
    with Executor(config=config) as executor:
        counts = grow_pool(path, executor_generator(executor), args.self_instruct, max_seconds=seconds)
    print(f"prompt pool: {counts}")
    return read_pool(path)[: args.self_instruct]


#: what a head to start from must share with the head this target would get (its MLP width may differ)
_SHAPE_FIELDS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "target_hidden_size",
    "aux_layer_ids",
)


def _start_head(path: str, cfg: Eagle3Config, target) -> Eagle3Head:
    """``--init-from``: an existing head (``shipped``: the one shipped for the default model), trained
    further with its own draft vocabulary; it must fit the target."""
    where = SHIPPED_HEAD if path == "shipped" else Path(path)
    embeddings = torch.nn.Embedding.from_pretrained(target.get_input_embeddings().weight.detach().clone())
    head = load_head(where, embeddings, torch.float32, "cpu")
    wrong = [f for f in _SHAPE_FIELDS if getattr(head.config, f) != getattr(cfg, f)]
    if wrong:
        mismatches = ", ".join(f"{f} {getattr(head.config, f)} (target: {getattr(cfg, f)})" for f in wrong)
        raise ValueError(f"--init-from {where}: this head does not fit the target: {mismatches}")
    return trainable(head)


def _head_config(target_config, draft_vocab_size: int, mlp_width: int | None = None) -> Eagle3Config:
    """A new head's config: the target's layer sizes (``mlp_width``: other MLP width), three features."""
    tc = target_config.get_text_config()
    heads = tc.num_attention_heads
    rope = getattr(tc, "rope_parameters", None) or {}
    return Eagle3Config(
        hidden_size=tc.hidden_size,
        intermediate_size=mlp_width or tc.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=tc.num_key_value_heads or heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // heads,
        vocab_size=tc.vocab_size,
        draft_vocab_size=min(draft_vocab_size, tc.vocab_size),
        target_hidden_size=tc.hidden_size,
        rms_norm_eps=tc.rms_norm_eps,
        rope_theta=float(rope.get("rope_theta", getattr(tc, "rope_theta", 10000.0))),
        max_position_embeddings=tc.max_position_embeddings,
        aux_layer_ids=default_aux_layers(tc.num_hidden_layers),
    )


def _init_head(cfg: Eagle3Config, target, draft_ids, lm_rows) -> Eagle3Head:
    """Start close to the target: lm_head = the target's output rows of the draft vocabulary, the final
    norm copied, fc passing the high feature through, the layer's residual branches scaled down."""
    embeddings = torch.nn.Embedding.from_pretrained(target.get_input_embeddings().weight.detach().clone())
    head = Eagle3Head(cfg, embeddings)
    with torch.no_grad():
        head.lm_head.weight.copy_(lm_rows)
        head.norm.weight.copy_(target.get_decoder().norm.weight)
        h = cfg.hidden_size
        head.fc.weight.mul_(0.1)
        head.fc.weight[:, 2 * h :] += torch.eye(h)
        head.midlayer.self_attn.o_proj.weight.mul_(0.1)
        head.midlayer.mlp.down_proj.weight.mul_(0.1)
        head.d2t.copy_(d2t_for(draft_ids))
        head.t2d.zero_()
        head.t2d[draft_ids] = True
    return head
