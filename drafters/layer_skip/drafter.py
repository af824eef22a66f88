"""LayerSkip self-speculation (the SWIFT variant: no training): the target drafts with a subset of its
own layers, sharing its weights and its KV cache.

Each drafting step runs the kept layers over one token per request at the slot the target will verify
it in: their K/V go into the target's own pages for those layers (no second cache, no extra memory),
and the verifying forward overwrites them with the full model's. Earlier positions are the target's
verified K/V, so a draft attends what the full model computed. Drafts are the subset's greedy tokens
(deterministic: verified by drawing from the target's distribution).

The skipped layers are given (``skip_layers``) or chosen at start-up (`choice.py`) on calibration text
the target continues itself. It needs specexec's own decoder (a Llama-family target, ``model_impl``
auto or specexec), whose layer stack runs as one C++ op for any subset.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ...executor.engine.scratch_forward import SCRATCH_REQUEST_ID
from ...executor.model.forward_io import SequenceInput
from ..base import Drafter, DraftProposal
from .choice import candidate_sets, expected_speedup
from .options import LayerSkipOptions

logger = logging.getLogger("specexec.loading")

#: what the target continues at start-up to choose the layers: a question, an extraction, code
CALIBRATION_PROMPTS = (
    "Explain in a few sentences why the sky is blue and why sunsets are red.",
    "Extract the name, the city and the date from this text: 'On 12 March 2024, Maria Lopez opened "
    "a bakery in Valencia, where she had worked as a teacher for ten years.' Answer as JSON.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
)


class LayerSkipDrafter(Drafter):
    runs_on_loop_thread = True  #: built in: bounded work, no thread hop (see Drafter)

    def __init__(
        self, max_draft_len: int = 3, options: LayerSkipOptions | None = None, tokenizer=None
    ) -> None:
        super().__init__(max_draft_len)
        self.options = options if options is not None else LayerSkipOptions()
        self.tokenizer = tokenizer
        self.skipped: tuple[int, ...] = ()  #: set by `bind_target`
        self.choice: str = ""  #: how the skipped layers were chosen (for logs and reports)
        self._layers: nn.ModuleList | None = None

    # ---- set-up ----------------------------------------------------------------------------------
    def bind_target(self, binding) -> None:
        super().bind_target(binding)
        runner = binding.runner
        if getattr(runner, "decoder", None) is None:
            raise ValueError(
                "LayerSkip drafts with the target's own layers: it needs specexec's own decoder "
                "(a Llama-family target with model_impl auto or specexec), not transformers' modules"
            )
        layers = runner.model.model.layers
        if self.options.skip_layers is not None:
            bad = [i for i in self.options.skip_layers if i >= len(layers)]
            if bad or len(set(self.options.skip_layers)) >= len(layers):
                raise ValueError(
                    f"skip_layers {self.options.skip_layers}: the target has layers 0..{len(layers) - 1}, and one must run"
                )
            self.skipped = tuple(sorted(set(self.options.skip_layers)))
            self.choice = "given"
        else:
            self.skipped, self.choice = self._choose(layers)
        self._layers = nn.ModuleList([layer for i, layer in enumerate(layers) if i not in self.skipped])
        logger.info(
            "LayerSkip: the draft skips %d of %d layers %s (%s)",
            len(self.skipped), len(layers), list(self.skipped), self.choice,
        )  # fmt: skip

    @torch.inference_mode()
    def _choose(self, layers: nn.ModuleList) -> tuple[tuple[int, ...], str]:
        candidates = candidate_sets(len(layers))
        if not candidates or self.tokenizer is None:
            raise ValueError(
                "LayerSkip needs skip_layers for this target (no tokenizer or too few layers to choose from)"
            )
        texts = [self._continued(prompt) for prompt in CALIBRATION_PROMPTS]
        scored = []
        for cand in candidates:
            kept = nn.ModuleList([layer for i, layer in enumerate(layers) if i not in cand.skipped])
            agree = total = 0
            for tokens, start in texts:
                greedy = self._logits(tokens, kept).argmax(dim=-1).tolist()  # [len(tokens)]
                agree += sum(g == t for g, t in zip(greedy[start - 1 : -1], tokens[start:]))
                total += len(tokens) - start
            share = 1 - len(cand.skipped) / len(layers)
            rate = agree / max(total, 1)
            scored.append((expected_speedup(rate, share, self.max_draft_len), rate, share, cand))
        best, rate, share, cand = max(scored, key=lambda item: item[0])
        self.initial_acceptance = rate
        return cand.skipped, (
            f"chosen at start-up: {cand.name}; agreement {rate:.2f} with the full model on calibration "
            f"text, {share:.0%} of the layers run, {best:.2f}x the tokens per forward-time of plain decoding by "
            f"the chain model ({len(candidates)} candidates)"
        )

    def _continued(self, prompt: str) -> tuple[list[int], int]:
        """(prompt + the target's greedy continuation, where the continuation starts)."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)
        else:
            ids = list(tok(prompt)["input_ids"])
        start = len(ids)
        bm = self.binding.block_manager
        bm.allocate(SCRATCH_REQUEST_ID, start + self.options.calibration_tokens)
        try:  # a prefill, then one decode step a token on the same scratch pages
            table = bm.block_tables[SCRATCH_REQUEST_ID]
            seq = SequenceInput(list(ids), 0, table, 1)
            for _ in range(self.options.calibration_tokens):
                ids.append(int(self._forward([seq], None)[-1].argmax()))
                seq = SequenceInput([ids[-1]], len(ids) - 1, table, 1)
        finally:
            bm.free(SCRATCH_REQUEST_ID)
        return ids, start

    def _logits(self, tokens: list[int], layers: nn.ModuleList | None) -> torch.Tensor:
        """Logits [len(tokens), vocab] of one prefill over ``tokens`` on scratch pages (all layers, or
        ``layers``), the pages freed at once."""
        bm = self.binding.block_manager
        bm.allocate(SCRATCH_REQUEST_ID, len(tokens))
        try:
            seq = SequenceInput(list(tokens), 0, bm.block_tables[SCRATCH_REQUEST_ID], len(tokens))
            return self._forward([seq], layers)
        finally:
            bm.free(SCRATCH_REQUEST_ID)

    def _forward(self, seqs: list[SequenceInput], layers: nn.ModuleList | None) -> torch.Tensor:
        runner = self.binding.runner
        batch = runner.prepare(seqs)
        logits, _ = runner.decoder.forward(
            batch.input_ids, batch.positions, batch.metadata, batch.logit_indices, (), layers=layers
        )
        return logits  # [rows, vocab]

    # ---- drafting ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def prepare_draft_tokens(self, scheduled_requests: list, resources) -> dict[str, DraftProposal]:
        """Each step one forward of the kept layers over one token per request: its root first, then its
        last draft, at the slots the target verifies them in."""
        tables = self.binding.block_manager.block_tables
        todo = [(s.request, s.num_draft_slots) for s in scheduled_requests if s.num_draft_slots > 0]
        drafts: dict[str, list[int]] = {r.request_id: [] for r, _ in todo}
        feed = {r.request_id: r.token_ids[r.num_computed_tokens] for r, _ in todo}
        step = 0
        while todo:
            seqs = [
                SequenceInput([feed[r.request_id]], r.num_computed_tokens + step, tables[r.request_id], 1)
                for r, _ in todo
            ]
            tokens = self._forward(seqs, self._layers).argmax(dim=-1).tolist()  # [R]
            still = []
            for (r, n), token in zip(todo, tokens):
                drafts[r.request_id].append(token)
                feed[r.request_id] = token
                if len(drafts[r.request_id]) < n:
                    still.append((r, n))
            todo, step = still, step + 1
        return {rid: DraftProposal(tokens) for rid, tokens in drafts.items()}
