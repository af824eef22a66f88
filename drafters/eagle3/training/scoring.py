"""Teacher-forced scoring of an EAGLE-3 head on the held-out evaluation draws, for the report scripts
that study a head offline (`bench/reports/*/window_sweep.py`, `seen_and_held_out.py`).

The target answers a set's evaluation prompts (the draw `eagle3_eval` takes; greedy, 128 tokens) with
its hidden states captured over the whole context, cached under a root directory so that every script
and every head reads the same features.
"""

from __future__ import annotations

from pathlib import Path

import torch

MAX_CONTEXT = 4200  #: the extraction set's longest prompt (3.2k tokens) and its answer


def held_out_features(name: str, num: int, root: Path, num_layers: int) -> Path:
    """The directory ``root / name`` holding the target's features over the first ``num`` prompts of
    dataset ``name`` (generated once, then read from the cache)."""
    from ....prompt_sets.datasets import load_dataset
    from ..head import default_aux_layers
    from .corpus import generate_corpus

    out = root / name
    layers = (*default_aux_layers(num_layers), num_layers)
    prompts = load_dataset(name, num)
    generate_corpus(
        out / "corpus.jsonl", layers, num_prompts=num, max_tokens=128, prompts=prompts,
        keep_positions=MAX_CONTEXT, max_batch_size=8 if name == "extraction" else 24,
    )  # fmt: skip
    return out


def scoring_head(head_dir: Path):
    """The head in ``head_dir`` (float32, CPU, eval mode) with what scoring it needs: the target's output
    rows of its draft vocabulary ``[draft_vocab, hidden]``, the ``[vocab]`` mask of that vocabulary, and
    the target's number of layers."""
    from ....executor.model.model_loader import load_model
    from ..head import load_head

    target = load_model(None, dtype="float32", progress=False).model
    embeddings = torch.nn.Embedding.from_pretrained(target.get_input_embeddings().weight.detach().clone())
    head = load_head(head_dir, embeddings, torch.float32, "cpu").eval()
    draft_ids = head.t2d.nonzero()[:, 0]
    lm_rows = target.get_output_embeddings().weight[draft_ids].detach()
    in_draft = torch.zeros(head.config.vocab_size, dtype=torch.bool)
    in_draft[draft_ids] = True
    return head, lm_rows, in_draft, target.config.num_hidden_layers
