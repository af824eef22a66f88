"""The captured decode/verify forward (CUDA graphs), as far as a machine without a GPU can test it.

A CUDA graph fixes three things: the shapes (batch bucket x padded query length x key pages), the
buffers its inputs are read from, and every Python-side decision taken while capturing. The eager-replay
backend keeps all three and only launches eagerly, so here the captured path runs for real: shape
picking, the padded layout, the row gathers, capture failures. What only a graph can break (a forward
that reads the device on the host, or takes host data, while capturing) is checked by running the
captured function on the meta device, where any value read fails, under a mode that refuses host tensors.
The launches themselves are tested on a GPU (`test_cuda_executor.py`, marked gpu).
"""

from __future__ import annotations

import random

import pytest
import torch
from capture_checks import CapturabilityCheck
from factories import greedy_requests, tiny_config
from specexec import Executor, ExecutorConfig
from specexec.drafters.draft_masks import DraftMasks
from specexec.executor.engine_setup import capture_cuda_graphs
from specexec.executor.model.cuda_graphs import EagerReplay, GraphCaptureReport
from specexec.executor.model.forward_io import SequenceInput
from specexec.executor.model.graph_shapes import GraphShape, GraphShapes
from specexec.executor.model.kv_cache import KVCache, KVCacheSpec
from specexec.executor.model.model_runner import ModelRunner
from specexec.kernels import apply_mask_inplace
from tiny_models import ARCHS, EXTRA_ARCHS, make_prompts, make_tiny_model

BLOCK = 4

# ---- shapes ----------------------------------------------------------------------------------------------


def test_buckets_cover_the_model_and_a_step_takes_the_smallest_shape_holding_it():
    shapes = GraphShapes.for_model(12, (1, 4, 17), 300, 16, max_num_tokens=2048)
    assert shapes.batch_sizes == (1, 2, 4, 8, 12)
    assert shapes.query_lens == (1, 4, 17)
    assert shapes.block_counts == (32, 64, 128, 256, 300)  # from 512 tokens, doubling, then all pages
    assert shapes.pick(3, 2, 40) == GraphShape(4, 4, 64)
    assert shapes.pick(12, 17, 300) == GraphShape(12, 17, 300)
    assert shapes.pick(1, 1, 1) == GraphShape(1, 1, 32)
    assert shapes.pick(13, 1, 1) is None, "a batch above the largest bucket runs eagerly"
    assert shapes.pick(1, 18, 1) is None, "a longer query (a prefill chunk) runs eagerly"
    assert shapes.pick(1, 1, 301) is None
    every = shapes.all()
    assert len(every) == 5 * 3 * 5 and every == sorted(every, reverse=True)
    assert shapes.bound == GraphShape(12, 17, 300)


def test_no_shape_holds_more_tokens_than_a_forward_may():
    shapes = GraphShapes.for_model(32, (1, 4), 8, 16, max_num_tokens=64)
    assert shapes.block_counts == (8,)  # fewer pages than the smallest bucket: one bucket
    assert all(s.num_tokens <= 64 for s in shapes.all())
    assert shapes.pick(16, 4, 8) == GraphShape(16, 4, 8)
    assert shapes.pick(17, 4, 8) is None and shapes.pick(32, 1, 8) == GraphShape(32, 1, 8)


# ---- the captured path -----------------------------------------------------------------------------------


def paged_runner(arch: str, layers=(1, 4), num_blocks: int = 64) -> ModelRunner:
    _, model = make_tiny_model(arch)
    spec = KVCacheSpec.from_model_config(model.config, torch.float64)
    return ModelRunner(model, KVCache(spec, num_blocks, BLOCK, torch.device("cpu")), 128, layers)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_replayed_step_returns_what_the_eager_forward_returns(arch):
    """A ragged decode/verify step (1, 4 and 2 new tokens, one logit row for the last) after prompts that
    run past gemma3's sliding window: logits, hidden states and offsets equal the eager forward's."""
    runner = paged_runner(arch)
    pages = list(range(64))
    random.Random(0).shuffle(pages)
    tables = [pages[0:4], pages[4:7], pages[7:15]]
    prompts = [list(range(5, 18)), list(range(40, 46)), list(range(60, 90))]
    runner.forward([SequenceInput(p, 0, t, 1) for p, t in zip(prompts, tables)])
    step = [
        SequenceInput([7], 13, tables[0], 1),
        SequenceInput([8, 9, 10, 11], 6, tables[1], 4),
        SequenceInput([12, 13], 30, tables[2], 1),
    ]
    eager = runner.forward(step)
    report = runner.capture_graphs(GraphShapes.for_model(4, (1, 4), 16, BLOCK, 128), EagerReplay())
    assert report.error is None and report.num_graphs == 3 * 2 * 1
    replayed = runner.forward(step)
    assert runner.graphs.stats.replays_by_shape == {GraphShape(4, 4, 16): 1}
    assert replayed.cu_logit_rows == eager.cu_logit_rows == [0, 1, 5, 6]
    assert replayed.cu_tokens == eager.cu_tokens == [0, 1, 5, 7]
    torch.testing.assert_close(replayed.logits, eager.logits, rtol=1e-12, atol=1e-12)
    assert replayed.hidden_states.keys() == eager.hidden_states.keys() == {1, 4}
    for layer in (1, 4):
        torch.testing.assert_close(replayed.hidden_states[layer], eager.hidden_states[layer])
    # a prefill chunk longer than every captured query runs eagerly
    runner.forward([SequenceInput(list(range(20)), 0, pages[20:25], 1)])
    assert runner.graphs.stats.num_eager == 1


@pytest.mark.parametrize("arch", ARCHS + EXTRA_ARCHS)
def test_the_captured_forward_reads_no_value_and_takes_no_host_data(arch):
    _, model = make_tiny_model(arch)
    model = model.to("meta")
    spec = KVCacheSpec.from_model_config(model.config, torch.float64)
    runner = ModelRunner(model, KVCache(spec, 32, BLOCK, torch.device("meta")), 64, (1, 2))
    report = runner.capture_graphs(GraphShapes.for_model(4, (1, 3), 16, BLOCK, 64), CapturabilityCheck())
    assert report.error is None, report.error
    assert report.num_graphs == 3 * 2


def test_the_eagle3_heads_captured_forward_reads_no_value_and_takes_no_host_data(tmp_path):
    from eagle3_heads import make_head_dir
    from specexec.drafters.eagle3.drafter import Eagle3Drafter
    from specexec.drafters.eagle3.head import load_head

    make_head_dir(tmp_path)
    _, target = make_tiny_model("llama")
    target = target.to("meta")
    head = load_head(tmp_path, target.get_input_embeddings(), torch.float64, "meta")
    drafter = Eagle3Drafter(head, 3, 256, 4, block_size=BLOCK, max_num_tokens=64, kv_cache_memory_gb=0.01)
    (report,) = drafter.capture_cuda_graphs(CapturabilityCheck(), max_batch_size=4, max_model_len=64)
    assert report.error is None, report.error
    assert report.model == "EAGLE-3 head" and report.num_graphs == 3 * 2


class FailingCapture:
    """A forward that cannot be captured (as a host read during a CUDA capture raises)."""

    label = "CUDA graphs"

    def capture(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    def memory_in_use(self) -> int:
        return 0


class InvalidatedCapture(FailingCapture):
    """As torch fails a capture that an operation inside it invalidated: the operation raises, and then
    ``capture_end`` raises a second error while the first is handled."""

    def capture(self, fn):
        try:
            raise RuntimeError("operation not permitted when stream is capturing")
        except RuntimeError:
            raise RuntimeError(
                "operation failed due to a previous error during capture\nSearch for ..."
            ) from None


def plain_tokens(arch: str, prompts) -> list[list[int]]:
    """Greedy output of a plain executor (nothing captured)."""
    _, model = make_tiny_model(arch)
    with Executor(model, tiny_config(device="auto", speculative_config=None)) as executor:
        return [o.token_ids for o in executor.run(greedy_requests(prompts, 12))]


def test_a_forward_that_cannot_be_captured_runs_eagerly_and_says_why():
    prompts = make_prompts(3, [4, 9, 2], seed=1)
    expected = plain_tokens("llama", prompts)
    _, model = make_tiny_model("llama")
    with Executor(model, tiny_config(device="auto", speculative_config=None)) as executor:
        core = executor.core
        (report,) = capture_cuda_graphs(
            executor.config, core.runner, None, core.max_model_len, FailingCapture()
        )
        assert "not permitted when stream is capturing" in report.error
        assert "runs eagerly" in report.describe() and core.runner.graphs is None
        assert [o.token_ids for o in executor.run(greedy_requests(prompts, 12))] == expected


def test_a_capture_invalidated_by_an_operation_names_that_operation_and_where_it_ran():
    _, model = make_tiny_model("llama")
    with Executor(model, tiny_config(device="auto", speculative_config=None)) as executor:
        core = executor.core
        (report,) = capture_cuda_graphs(
            executor.config, core.runner, None, core.max_model_len, InvalidatedCapture()
        )
    assert report.error.startswith(
        "RuntimeError: operation failed due to a previous error during capture (after "
    )
    assert "Search for" not in report.error  # one line
    assert "RuntimeError: operation not permitted when stream is capturing at " in report.error
    assert "test_cuda_graphs.py:" in report.error  # the line that raised first


def test_without_a_drafter_decode_steps_replay_and_the_output_is_unchanged():
    prompts = make_prompts(8, [1, 30, 5, 17, 2, 12, 9, 20], seed=3)
    expected = plain_tokens("gemma3", prompts)
    _, model = make_tiny_model("gemma3")
    with Executor(model, tiny_config(device="auto", speculative_config=None)) as executor:
        core = executor.core
        (report,) = capture_cuda_graphs(executor.config, core.runner, None, core.max_model_len, EagerReplay())
        # target query lengths: 1 (decode) and 17 (a grammar-forced run); batch buckets up to 8
        assert report.shapes.query_lens == (1, 17) and report.shapes.batch_sizes == (1, 2, 4, 8)
        outputs = executor.run(greedy_requests(prompts, 12))
        assert [o.token_ids for o in outputs] == expected
        stats = core.runner.graphs.stats
        assert stats.num_replays >= 11 and stats.num_eager >= 1  # the 96-token prefill runs eagerly
        assert core.block_manager.num_free_blocks == core.block_manager.num_blocks


def test_cuda_graphs_is_a_config_switch_and_nothing_is_captured_on_cpu():
    with pytest.raises(ValueError, match="cuda_graphs"):
        ExecutorConfig(cuda_graphs="yes")
    assert ExecutorConfig.from_dict({"cuda_graphs": False}).cuda_graphs is False
    _, model = make_tiny_model("llama")
    with Executor(model, tiny_config(device="cpu", speculative_config=None)) as executor:
        assert executor.config.cuda_graphs is True and executor.setup.cuda_graphs == []
        assert executor.core.runner.graphs is None


def test_hidden_state_layers_cannot_be_added_once_captured():
    runner = paged_runner("llama", layers=(2,))
    runner.capture_graphs(GraphShapes.for_model(2, (1,), 16, BLOCK, 128), EagerReplay())
    runner.capture((2,))  # already recorded: fine
    with pytest.raises(RuntimeError, match="before the CUDA graphs are captured"):
        runner.capture((3,))


def test_a_report_names_the_model_its_graphs_time_and_shapes():
    shapes = GraphShapes.for_model(2, (1, 4), 64, 16, 2048)
    report = GraphCaptureReport("target", num_graphs=4, seconds=1.5, memory_bytes=3 * 2**20, shapes=shapes)
    assert report.describe() == (
        "target: 4 CUDA graphs (batch [1, 2] x query [1, 4] x pages [32, 64]) in 1.50 s, 3 MiB"
    )


# ---- the drafters' grammar masks -------------------------------------------------------------------------


class PatternMatcher:
    """Allows the tokens t with t % modulus == 0 (a stand-in for a grammar matcher)."""

    def __init__(self, modulus: int) -> None:
        self.modulus = modulus

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        allowed = torch.zeros(bitmask.shape[1] * 32, dtype=torch.bool)
        allowed[:: self.modulus] = True
        bits = allowed.view(-1, 32).long() << torch.arange(32)
        bitmask[row] = bits.sum(dim=1).to(torch.int64).to(torch.int32)


def test_draft_masks_mask_each_row_by_its_own_grammar_and_leave_unguided_rows_alone():
    vocab = 100
    masks = DraftMasks(vocab, "cpu")
    matchers = [PatternMatcher(2), None, PatternMatcher(3)] * 4  # 12 rows: the buffer grows past 8
    logits = torch.randn(12, vocab)
    expected = logits.clone()
    for i, m in enumerate(matchers):
        if m is not None:
            expected[i, torch.arange(vocab) % m.modulus != 0] = float("-inf")
    masks.apply(logits, matchers)
    assert torch.equal(logits, expected)
    masks.apply(logits[:2], [None, None])  # nothing guided: nothing to do
    assert torch.equal(logits, expected)


def test_draft_masks_reach_draft_logits_through_d2t():
    vocab, draft_vocab = 64, 8
    d2t = torch.tensor([0, 1, 3, 5, 6, 10, 20, 40]) - torch.arange(draft_vocab)  # draft i -> target ids
    logits = torch.zeros(1, draft_vocab)
    DraftMasks(vocab, "cpu").apply(logits, [PatternMatcher(2)], d2t=d2t)
    allowed = [t % 2 == 0 for t in (0, 1, 3, 5, 6, 10, 20, 40)]
    assert torch.isfinite(logits[0]).tolist() == allowed
    reference = torch.zeros(1, draft_vocab)
    bitmask = torch.zeros(1, 2, dtype=torch.int32)
    PatternMatcher(2).fill_next_token_bitmask(bitmask, 0)
    apply_mask_inplace(reference, bitmask, d2t=d2t)
    assert torch.equal(logits, reference)


def test_a_step_that_does_not_fit_a_shape_is_refused_not_truncated():
    from specexec.executor.model.static_batch import StaticInputs

    runner = paged_runner("llama")
    inputs = StaticInputs(runner.kv_cache, GraphShape(2, 2, 4))
    with pytest.raises(ValueError, match="do not fit"):
        inputs.write([SequenceInput([1], 0, [0], 1)] * 3, GraphShape(2, 2, 4))
    with pytest.raises(ValueError, match="does not fit"):
        inputs.write([SequenceInput([1, 2, 3], 0, [0], 3)], GraphShape(2, 2, 4))
    with pytest.raises(ValueError, match="does not fit"):  # its keys span a fifth page
        inputs.write([SequenceInput([1], 16, [0, 1, 2, 3, 4], 1)], GraphShape(2, 2, 4))
