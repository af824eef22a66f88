"""Per-model CUDA graphs of the decode/verify forward: captured once at start-up, replayed every step.

`StepGraphs` holds one model's captured forwards, one per `GraphShape` (batch bucket x padded query
length x key pages). A step that fits a shape writes its inputs into that shape's buffers (one copy,
`static_batch.py`), scatters any per-token inputs (EAGLE-3's hidden states) into their buffers, replays,
and gathers its real rows out of the graph's outputs. The gather is a copy, so nothing a step keeps lives
in graph memory: every model's graphs share one memory pool (`CudaGraphCapture.pool`), which is safe
because graphs replay one at a time on one stream and their outputs are read before the next replay.

Two capture backends: `CudaGraphCapture` (torch.cuda.CUDAGraph; a warm-up run of each shape on the
capture stream, then the capture) and `EagerReplay`, which "replays" by calling the function again. The
second keeps everything a graph fixes (shapes, padding, buffers, the Python-side structure built once
at capture) and only launches eagerly: it is how the static path is tested where there is no GPU.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .attention_metadata import AttentionMetadata
from .forward_io import SequenceInput
from .graph_shapes import GraphShape, GraphShapes
from .static_batch import StaticInputs, StaticViews, StepLayout

logger = logging.getLogger("specexec")

#: (views, attention metadata, per-token input buffers) -> (outputs per logit row, outputs per token),
#: every output [B * Q, ...] over the shape's flat batch
StaticForward = Callable[
    [StaticViews, AttentionMetadata, dict[str, torch.Tensor]],
    tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]],
]
Outputs = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]


class CudaGraphCapture:
    """Captures CUDA graphs into one memory pool shared by every model of an executor (a fresh pool
    after a capture that failed)."""

    label = "CUDA graphs"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    def capture(self, fn: Callable[[], Outputs]) -> Callable[[], Outputs]:
        """Run ``fn`` once on the capture stream (lazy initialisation: cuBLAS workspaces, kernel loads),
        capture it, and return the replay."""
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            fn()
        current.wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                outputs = fn()
        except Exception:
            self._recover_from_failed_capture(current)
            raise

        def replay() -> Outputs:
            graph.replay()
            return outputs

        return replay

    def _recover_from_failed_capture(self, stream: torch.cuda.Stream) -> None:
        """A capture that fails leaves torch mid-capture: ``torch.cuda.graph``'s exit raises from
        ``capture_end`` before it restores the current stream, before the caching allocators (device
        and pinned host) stop recording into the pool, and before the device's default generator leaves
        capture mode. On an H100 (torch 2.11) the next capture into the same pool then raised
        "beginAllocateToPool: already recording to mempool_id", and every random draw on the device
        raised "Offset increment outside graph capture encountered unexpectedly". So: put the stream
        back; capture from now on into a fresh pool (the stale recording's filter names the failed
        capture's id, which no later capture has, and torch has no public call to close the host
        allocator's); and give the generator a copy of its state (same seed and offset) that is not
        capturing. Graphs captured before keep their pool and the old state; none of ours draws random
        numbers."""
        torch.cuda.set_stream(stream)
        self.pool = torch.cuda.graph_pool_handle()
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        generator = torch.cuda.default_generators[index]
        generator.graphsafe_set_state(generator.clone_state())

    def memory_in_use(self) -> int:
        return torch.cuda.memory_reserved(self.device)


class EagerReplay:
    """A stand-in for CUDA graphs: the same fixed shapes, buffers and once-built structure, launched
    eagerly. Where no GPU exists it is how the captured path is tested."""

    label = "eager-replay forwards"

    def capture(self, fn: Callable[[], Outputs]) -> Callable[[], Outputs]:
        fn()
        return fn

    def memory_in_use(self) -> int:
        return 0


@dataclass(slots=True)
class GraphCaptureReport:
    """What capturing one model's graphs took."""

    model: str  #: "target", "draft model", "EAGLE-3 head"
    kind: str = CudaGraphCapture.label  #: what was captured (the backend's label)
    num_graphs: int = 0
    seconds: float = 0.0  #: warm-up and capture of every shape
    memory_bytes: int = 0  #: device memory the captures reserved (the graph pool; input buffers not counted)
    shapes: GraphShapes | None = None
    error: str | None = None  #: why this model runs eagerly (a capture failed), else None

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.model}: no {self.kind} ({self.error}); it runs eagerly"
        dims = ""
        if (s := self.shapes) is not None:
            dims = (
                f" (batch {list(s.batch_sizes)} x query {list(s.query_lens)} x pages {list(s.block_counts)})"
            )
        return (
            f"{self.model}: {self.num_graphs} {self.kind}{dims} in {self.seconds:.2f} s, "
            f"{self.memory_bytes / 2**20:.0f} MiB"
        )


def describe_failure(exc: BaseException) -> str:
    """One line: the error, and the first one it followed when there is one. A capture invalidated by an
    operation inside the forward surfaces from ``capture_end`` ("operation failed due to a previous error
    during capture"); the operation's own error, and where it was raised, is the exception it followed."""
    first = exc
    while (earlier := first.__cause__ or first.__context__) is not None:
        first = earlier
    if first is exc:
        return _first_line(exc)
    frames = traceback.extract_tb(first.__traceback__)
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{_first_line(exc)} (after {_first_line(first)}{at})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


@dataclass(slots=True)
class GraphStats:
    """How one model's forwards ran."""

    num_replays: int = 0  #: forwards replayed from a graph
    num_eager: int = 0  #: forwards that fit no captured shape (prefill chunks, large batches)
    replays_by_shape: dict[GraphShape, int] = field(default_factory=dict)


class StepGraphs:
    """The captured decode/verify forwards of one model."""

    def __init__(
        self,
        inputs: StaticInputs,
        shapes: GraphShapes,
        forward: StaticForward,
        token_inputs: dict[str, tuple[int, torch.dtype]] | None = None,
    ) -> None:
        self.inputs = inputs
        self.shapes = shapes
        self.forward = forward
        largest = inputs.largest
        #: per-token inputs the forward reads (name -> [B * Q, width] buffer of the largest shape)
        self.token_buffers = {
            name: torch.zeros(largest.num_tokens, width, dtype=dtype, device=inputs.device)
            for name, (width, dtype) in (token_inputs or {}).items()
        }
        self._replays: dict[GraphShape, Callable[[], Outputs]] = {}
        self._views: dict[GraphShape, StaticViews] = {}  # each shape's buffers, as its graph reads them
        self.stats = GraphStats()

    def capture(self, backend, paths, model: str) -> GraphCaptureReport:
        """Capture every shape, largest first. A shape that fails to capture leaves the whole model eager
        (the report says why)."""
        report = GraphCaptureReport(model, backend.label, shapes=self.shapes)
        memory_before = backend.memory_in_use()
        start = time.perf_counter()
        try:
            for shape in self.shapes.all():
                self.inputs.write([], shape)  # all padding: capturing writes only the padding page
                self._replays[shape] = backend.capture(self._bind(shape, paths))
        except Exception as exc:  # a forward that reads the device on the host, or is otherwise uncapturable
            self._replays.clear()
            self._views.clear()
            report.error = describe_failure(exc)
            logger.warning(
                "%s: CUDA graph capture failed, running eagerly: %s", model, report.error, exc_info=exc
            )
            return report
        report.num_graphs = len(self._replays)
        report.seconds = time.perf_counter() - start
        report.memory_bytes = backend.memory_in_use() - memory_before
        logger.info("captured %s", report.describe())
        return report

    def _bind(self, shape: GraphShape, paths) -> Callable[[], Outputs]:
        views = self._views[shape] = self.inputs.views(shape)
        token_inputs = {name: buffer[: shape.num_tokens] for name, buffer in self.token_buffers.items()}

        def run() -> Outputs:
            return self.forward(views, self.inputs.metadata(views, paths), token_inputs)

        return run

    @property
    def is_captured(self) -> bool:
        return bool(self._replays)

    def shape_for(self, seqs: list[SequenceInput]) -> GraphShape | None:
        bs = self.inputs.kv_cache.block_size
        shape = self.shapes.pick(
            len(seqs),
            max(len(s.token_ids) for s in seqs),
            max(-(-(s.start_pos + len(s.token_ids)) // bs) for s in seqs),
        )
        return shape if shape in self._replays else None

    def run(
        self, seqs: list[SequenceInput], token_inputs: dict[str, torch.Tensor] | None = None
    ) -> tuple[StepLayout, dict[str, torch.Tensor], dict[str, torch.Tensor]] | None:
        """Replay the smallest shape holding ``seqs``: the step's layout, and the outputs at its logit
        rows and at its tokens (copies, in step order). None when no captured shape holds the step (the
        caller runs it eagerly). ``token_inputs``: name -> [num_tokens, width] in step order."""
        shape = self.shape_for(seqs) if self._replays and seqs else None
        if shape is None:
            self.stats.num_eager += 1
            return None
        layout = self.inputs.write(seqs, shape)
        views = self._views[shape]
        for name, values in (token_inputs or {}).items():
            self.token_buffers[name].index_copy_(0, views.tokens[: layout.num_tokens], values)
        per_row, per_token = self._replays[shape]()
        rows, tokens = views.rows[: layout.num_rows], views.tokens[: layout.num_tokens]
        self.stats.num_replays += 1
        self.stats.replays_by_shape[shape] = self.stats.replays_by_shape.get(shape, 0) + 1
        return (
            layout,
            {name: out.index_select(0, rows) for name, out in per_row.items()},
            {name: out.index_select(0, tokens) for name, out in per_token.items()},
        )
