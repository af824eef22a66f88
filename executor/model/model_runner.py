"""Runs one model's forward over a flattened, ragged batch on its paged KV cache.

The inputs of an eager forward live in persistent buffers sized for the largest batch and are filled by
one copy. On CUDA a decode/verify step replays a captured graph instead (`capture_graphs`,
`cuda_graphs.py`) whenever one of the captured shapes holds it; prefill chunks and batches larger than
every shape run eagerly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ...sampling.tree_shape import depths, row_ancestor_bits
from .attention_metadata import AttentionMetadata, SequenceSlice
from .attention_paths import AttentionPaths
from .cuda_graphs import GraphCaptureReport, StaticForward, StepGraphs
from .decoder.convert import is_own_decoder
from .decoder.forward import OwnDecoder
from .forward_io import ForwardOutput, SequenceInput
from .graph_shapes import GraphShapes
from .kv_cache import KVCache
from .paged_attention import register_paged_attention
from .static_batch import StaticInputs, StaticViews


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find its decoder layers (expected `.layers`)")
    return layers


@dataclass(slots=True)
class PreparedBatch:
    """A forward's inputs, written into the runner's persistent buffers."""

    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    logit_indices: torch.Tensor  # [num_rows] flat index of each token that wants logits
    metadata: AttentionMetadata
    cu_logit_rows: list[int]  # [batch + 1]
    cu_tokens: list[int]  # [batch + 1]


class PagedInputs:
    """Persistent input buffers of one model over its paged KV cache, filled per forward."""

    def __init__(self, kv_cache: KVCache, max_num_tokens: int) -> None:
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.max_num_tokens = max_num_tokens
        self.device = kv_cache.kv.device
        # [4, max_num_tokens] rows: input ids, positions, cache slots, logit rows; one copy per forward fills them
        self._inputs = torch.zeros(4, max_num_tokens, dtype=torch.long, device=self.device)
        self.input_ids = self._inputs[0]  # [max_num_tokens]
        self.positions = self._inputs[1]  # [max_num_tokens]
        self.slot_mapping = self._inputs[2]  # [max_num_tokens]
        self.logit_indices = self._inputs[3]  # [max_num_tokens]
        self.attention_paths = AttentionPaths()  #: the measured kernels (set up by the engine)
        self.graphs: StepGraphs | None = None  #: captured decode/verify forwards (CUDA), see capture_graphs

    def _fill_inputs(self, seqs: list[SequenceInput]) -> tuple[list[SequenceSlice], list[int], list[int]]:
        slices, cu_tokens, cu_rows, logit_rows = [], [0], [0], []
        ids, positions, slots = [], [], []
        bs = self.block_size
        for seq in seqs:
            start, n = cu_tokens[-1], len(seq.token_ids)
            pos = range(seq.start_pos, seq.start_pos + n)  # the cache slots' positions
            tree = seq.tree_parents
            bits = None if tree is None else row_ancestor_bits(tree)
            slices.append(SequenceSlice(start, n, seq.start_pos, seq.block_table, bits))
            if tree is None:
                positions.extend(pos)
            else:  # a token tree: node i's K/V at slot start + 1 + i, its position start + its depth
                positions.extend([seq.start_pos] + [seq.start_pos + d for d in depths(tree)])
            ids.extend(seq.token_ids)
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in pos)
            logit_rows.extend(range(start + n - seq.num_logit_rows, start + n))
            cu_tokens.append(start + n)
            cu_rows.append(cu_rows[-1] + seq.num_logit_rows)
        num_tokens = cu_tokens[-1]
        if num_tokens > self.max_num_tokens:
            raise ValueError(f"batch of {num_tokens} tokens exceeds max_num_tokens={self.max_num_tokens}")
        logit_rows.extend([0] * (num_tokens - len(logit_rows)))  # (never more rows than tokens)
        host = torch.tensor([ids, positions, slots, logit_rows], dtype=torch.long)  # [4, num_tokens]
        self._inputs[:, :num_tokens].copy_(host, non_blocking=True)
        return slices, cu_tokens, cu_rows

    @torch.inference_mode()
    def capture_forward(
        self,
        shapes: GraphShapes,
        backend,
        model: str,
        forward: StaticForward,
        token_inputs: dict[str, tuple[int, torch.dtype]] | None = None,
    ) -> GraphCaptureReport:
        """Capture ``forward`` at every shape (`cuda_graphs.CudaGraphCapture`, or `EagerReplay` to run
        the same static path eagerly); `graphs` then holds the replays (None when capture failed)."""
        graphs = StepGraphs(StaticInputs(self.kv_cache, shapes.bound), shapes, forward, token_inputs)
        report = graphs.capture(backend, self.attention_paths, model)
        self.graphs = graphs if graphs.is_captured else None
        return report

    def prepare(self, seqs: list[SequenceInput]) -> PreparedBatch:
        slices, cu_tokens, cu_rows = self._fill_inputs(seqs)
        num_tokens, num_rows = cu_tokens[-1], cu_rows[-1]
        meta = AttentionMetadata.build(
            self.kv_cache, self.slot_mapping[:num_tokens], slices, self.block_size, self.attention_paths
        )
        return PreparedBatch(
            self.input_ids[:num_tokens],
            self.positions[:num_tokens],
            self.logit_indices[:num_rows],
            meta,
            cu_rows,
            cu_tokens,
        )


class ModelRunner(PagedInputs):
    """Runs a model's forward on the paged cache, specexec's own decoder where the model was converted
    to it (`decoder/`), else transformers' modules with paged attention plugged in; records the hidden
    states drafters ask for."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_cache: KVCache,
        max_num_tokens: int,
        capture_layers: tuple[int, ...] = (),
    ) -> None:
        super().__init__(kv_cache, max_num_tokens)
        self.model = model
        self.decoder = OwnDecoder(model) if is_own_decoder(model) else None
        if self.decoder is None:
            model.set_attn_implementation(register_paged_attention())
        self.capture_layers: tuple[int, ...] = ()  #: hidden-state indices every forward records
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks: dict[int, object] = {}
        self.capture(capture_layers)

    @property
    def model_impl(self) -> str:
        """Which forward runs: ``specexec`` (the own decoder) or ``transformers``."""
        return "specexec" if self.decoder is not None else "transformers"

    def capture(self, layers: tuple[int, ...]) -> None:
        """Record these ``hidden_states`` indices in every forward from now on (ForwardOutput.hidden_states):
        0 = embeddings, i = output of layer i-1, and the last (i = num_layers) after the final norm."""
        if self.graphs is not None and set(layers) - set(self.capture_layers):
            raise RuntimeError("hidden-state layers must be chosen before the CUDA graphs are captured")
        num_layers = len(_decoder_layers(self.model))
        for index in layers:
            if not 0 <= index <= num_layers:
                raise ValueError(f"capture layer {index} is out of range 0..{num_layers}")
            if self.decoder is None and index not in self._hooks:
                self._hooks[index] = self._capture_hook(index, num_layers)
        self.capture_layers = tuple(sorted(set(self.capture_layers) | set(layers)))

    def _capture_hook(self, index: int, num_layers: int):
        """A forward hook on transformers' module whose output is ``hidden_states[index]``."""
        decoder = self.model.get_decoder()
        if index == 0:
            module = decoder.embed_tokens
        elif index == num_layers:
            module = decoder.norm
        else:
            module = decoder.layers[index - 1]

        def hook(_module, _args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            self._captured[index] = hidden[0]  # [num_tokens, hidden]

        return module.register_forward_hook(hook)

    def capture_graphs(self, shapes: GraphShapes, backend, model: str = "target") -> GraphCaptureReport:
        """Capture the model's decode/verify forward at every shape; from then on `forward` replays them."""
        return self.capture_forward(shapes, backend, model, self._static_forward)

    def _static_forward(self, views: StaticViews, meta: AttentionMetadata, token_inputs):
        """The forward a graph captures: every token of the shape's flat batch, logits for all of them
        (the step's rows are gathered after the replay)."""
        logits, hidden = self._run_model(views.input_ids, views.positions, meta, None)
        return {"logits": logits}, {str(layer): h for layer, h in hidden.items()}  # [B * Q, ...] each

    @contextlib.contextmanager
    def wrapped_forward(self, wrap: Callable[[Callable], Callable]) -> Iterator[None]:
        """Every model call goes through ``wrap(forward)`` inside the block (a profiler's labels, a
        timer), then through the forward again."""
        self._run_model = wrap(type(self)._run_model.__get__(self))
        try:
            yield
        finally:
            del self._run_model

    def _run_model(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        meta: AttentionMetadata,
        logit_indices: torch.Tensor | None,  # [R] (None: every row)
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:  # logits [R, vocab], captured {index: [T, hidden]}
        if self.decoder is not None:
            return self.decoder.forward(input_ids, positions, meta, logit_indices, self.capture_layers)
        self._captured = {}
        out = self.model(
            input_ids=input_ids.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            use_cache=False,
            logits_to_keep=0 if logit_indices is None else logit_indices,
            paged_metadata=meta,
        )
        return out.logits[0], dict(self._captured)

    @torch.inference_mode()
    def forward(self, seqs: list[SequenceInput]) -> ForwardOutput:
        if self.graphs is not None and all(seq.tree_parents is None for seq in seqs):
            replayed = self.graphs.run(seqs)
            if replayed is not None:
                layout, per_row, per_token = replayed
                hidden = {int(layer): h for layer, h in per_token.items()}
                return ForwardOutput(per_row["logits"], layout.cu_rows, hidden, layout.cu_tokens)
        batch = self.prepare(seqs)
        logits, hidden = self._run_model(
            batch.input_ids, batch.positions, batch.metadata, batch.logit_indices
        )
        return ForwardOutput(logits, batch.cu_logit_rows, hidden, batch.cu_tokens)
