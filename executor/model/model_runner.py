"""Runs one model's forward over a flattened, ragged batch on its paged KV cache.

The inputs of an eager forward live in persistent buffers sized for the largest batch and are filled by
one copy. On CUDA a decode/verify step replays a captured graph instead (`capture_graphs`,
`cuda_graphs.py`) whenever one of the captured shapes holds it; prefill chunks and batches larger than
every shape run eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention_metadata import AttentionMetadata, SequenceSlice
from .attention_paths import AttentionPaths
from .cuda_graphs import GraphCaptureReport, StaticForward, StepGraphs
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
            slices.append(SequenceSlice(start, n, seq.start_pos, seq.block_table))
            ids.extend(seq.token_ids)
            pos = range(seq.start_pos, seq.start_pos + n)
            positions.extend(pos)
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
    """Runs an HF model's forward on the paged cache; records the hidden states drafters ask for."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_cache: KVCache,
        max_num_tokens: int,
        capture_layers: tuple[int, ...] = (),
    ) -> None:
        super().__init__(kv_cache, max_num_tokens)
        self.model = model
        model.set_attn_implementation(register_paged_attention())
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks: dict[int, object] = {}
        self.capture(capture_layers)

    def capture(self, layers: tuple[int, ...]) -> None:
        """Record these ``hidden_states`` indices in every forward from now on (ForwardOutput.hidden_states)."""
        if self.graphs is not None and set(layers) - set(self._hooks):
            raise RuntimeError("hidden-state layers must be chosen before the CUDA graphs are captured")
        for index in layers:
            if index not in self._hooks:
                self._hooks[index] = self._capture_hook(index)

    def _capture_hook(self, index: int):
        """Record ``hidden_states[index]`` as transformers numbers it: 0 = embeddings, i = output of layer
        i-1, and the last (i = num_layers) after the final norm."""
        layers = _decoder_layers(self.model)
        if not 0 <= index <= len(layers):
            raise ValueError(f"capture layer {index} is out of range 0..{len(layers)}")
        decoder = self.model.get_decoder()
        if index == 0:
            module = decoder.embed_tokens
        elif index == len(layers):
            module = decoder.norm
        else:
            module = layers[index - 1]

        def hook(_module, _args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            self._captured[index] = hidden[0]  # [num_tokens, hidden]

        return module.register_forward_hook(hook)

    def capture_graphs(self, shapes: GraphShapes, backend, model: str = "target") -> GraphCaptureReport:
        """Capture the model's decode/verify forward at every shape; from then on `forward` replays them."""
        return self.capture_forward(shapes, backend, model, self._static_forward)

    def _static_forward(self, views: StaticViews, meta: AttentionMetadata, token_inputs):
        """The forward a graph captures: every token of the shape's flat batch, logits for all of them."""
        self._captured = {}
        out = self.model(
            input_ids=views.input_ids.unsqueeze(0),
            position_ids=views.positions.unsqueeze(0),
            use_cache=False,
            logits_to_keep=0,  # every row: the step's rows are gathered after the replay
            paged_metadata=meta,
        )
        hidden = {str(layer): h for layer, h in self._captured.items()}  # [B * Q, hidden] each
        return {"logits": out.logits[0]}, hidden

    @torch.inference_mode()
    def forward(self, seqs: list[SequenceInput]) -> ForwardOutput:
        if self.graphs is not None:
            replayed = self.graphs.run(seqs)
            if replayed is not None:
                layout, per_row, per_token = replayed
                hidden = {int(layer): h for layer, h in per_token.items()}
                return ForwardOutput(per_row["logits"], layout.cu_rows, hidden, layout.cu_tokens)
        batch = self.prepare(seqs)
        self._captured = {}
        out = self.model(
            input_ids=batch.input_ids.unsqueeze(0),
            position_ids=batch.positions.unsqueeze(0),
            use_cache=False,
            logits_to_keep=batch.logit_indices,
            paged_metadata=batch.metadata,
        )
        logits = out.logits[0]  # [num_rows, vocab]
        return ForwardOutput(logits, batch.cu_logit_rows, dict(self._captured), batch.cu_tokens)
