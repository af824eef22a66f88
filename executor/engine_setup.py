"""Setting an engine up: check what can be checked before loading, load the model, size the KV pool,
build the drafter, capture the CUDA graphs (on CUDA), measure the forward-cost curve, and assemble the
`EngineCore`."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..drafters.base import DraftBinding, Drafter, DrafterContext
from .config import ExecutorConfig
from .engine.block_manager import BlockManager
from .engine.engine_core import EngineCore
from .engine.guided import MAX_FORCED_TOKENS, GuidedDecodingStage
from .engine.output_processor import OutputProcessor
from .engine.scheduler import Scheduler
from .engine.speculation.confidence_stop import ConfidenceStop
from .engine.speculation.draft_length import DraftLengthPolicy, ForwardCostModel
from .engine.speculation.speculation_stage import DrafterChoice, SpeculationStage, choose_drafter
from .engine.speculation.tree_config import resolve_draft_tree
from .kernel_plan.dtype import DtypeChoice, choose_dtype
from .kernel_plan.forward_cost import target_forward_cost
from .kernel_plan.plan import plan_kernels, route_quantized_layers
from .layers.measurement.cache_folder import resolve_cache_dir
from .layers.packed_linear import unpack_linears
from .model.cuda_graphs import CudaGraphCapture, GraphCaptureReport
from .model.decoder.convert import resolve_model_impl
from .model.graph_shapes import GraphShapes
from .model.kv_cache import KVCache, KVCacheSpec, num_blocks_for_budget
from .model.model_runner import ModelRunner
from .parallel.launch import refuse_unbuilt_options, start_ranks
from .setup_report import SetupReport

logger = logging.getLogger("specexec")


def check_before_loading(model, config: ExecutorConfig, drafter, plugins) -> Drafter | DrafterChoice | None:
    """Refuse, with a ValueError naming the key, whatever is wrong without loading any model: the
    drafter and its options, and a ``max_model_len`` beyond the model's position embeddings. Returns
    the drafter to build the engine with: the one passed in, or the config's with its options parsed."""
    if drafter is not None and not isinstance(drafter, Drafter):
        raise ValueError(f"drafter must be a specexec Drafter, got {type(drafter).__name__}")
    if config.speculative_config is not None and drafter is None:
        drafter = choose_drafter(config.speculative_config, plugins)
    if config.tensor_parallel_size > 1:
        refuse_unbuilt_options(model, config)
        if config.speculative_config is not None and config.speculative_config.draft_tree:
            raise ValueError("speculative_config.draft_tree does not run with tensor parallelism yet")
    if config.max_model_len is not None:
        limit = _model_position_limit(model, config)
        if limit is not None and config.max_model_len > limit:
            raise ValueError(
                f"config key 'max_model_len': got {config.max_model_len}; allowed: at most {limit}, "
                "the model's max_position_embeddings"
            )
    return drafter


def _model_position_limit(model, config: ExecutorConfig) -> int | None:
    if isinstance(model, torch.nn.Module):
        return getattr(model.config.get_text_config(), "max_position_embeddings", None)
    from .model.model_peek import peek_max_position_embeddings

    return peek_max_position_embeddings(model if model is not None else config.model)


def resolve_dtype(model, config: ExecutorConfig) -> DtypeChoice:
    """The dtype the model loads in: the config's, or for ``auto`` this machine's pick; a module passed
    in keeps its own."""
    if isinstance(model, torch.nn.Module):
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        return DtypeChoice(dtype, "the dtype of the module passed in")
    if config.dtype != "auto":
        return DtypeChoice(config.dtype, "configured")
    from .model.model_peek import peek_text_config

    shape = peek_text_config(model if model is not None else config.model)
    return choose_dtype(
        resolve_device(config.device),
        shape,
        resolve_cache_dir(config.cache_dir),
        config.quantization,
        config.quantized_kernel,
    )


def build_engine_core(
    model,
    config: ExecutorConfig,
    tokenizer,
    drafter: Drafter | DrafterChoice | None,
    plugins,
    dtype: DtypeChoice,
) -> tuple[EngineCore, SetupReport]:
    """Load (in ``dtype``, see `resolve_dtype`), size the KV pool, build the stages; ``drafter`` is what
    `check_before_loading` returned. Returns the engine and what set-up chose (`SetupReport`)."""
    model, tokenizer, target_path, quantization, model_impl = load_target(
        model, tokenizer, config, dtype.dtype
    )
    extra = (target_path, quantization, model_impl, dtype)
    param = next(model.parameters())
    spec = KVCacheSpec.from_model_config(model.config, param.dtype)
    num_blocks = config.num_kv_blocks or num_blocks_for_budget(
        spec, config.block_size, int(config.kv_cache_memory_gb * 2**30)
    )
    block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
    if config.tensor_parallel_size > 1:  # the shards keep the quantized layers' int8_dot routing
        route_quantized_layers(config, model)
        runner = start_ranks(model, spec, num_blocks, config)
        try:
            runner.capture(tuple(config.capture_hidden_layers))
            return _assemble(model, tokenizer, config, drafter, plugins, runner, block_manager, extra)
        except BaseException:
            runner.close()  # no worker outlives a failed set-up
            raise
    runner = ModelRunner(
        model,
        KVCache(spec, num_blocks, config.block_size, param.device),
        config.max_num_tokens,
        tuple(config.capture_hidden_layers),
    )
    return _assemble(model, tokenizer, config, drafter, plugins, runner, block_manager, extra)


def _assemble(
    model, tokenizer, config, drafter, plugins, runner, block_manager, extra
) -> tuple[EngineCore, SetupReport]:
    """The stages around the runner: drafter, kernels chosen, graphs, speculation, grammar, scheduler."""
    target_path, quantization, model_impl, dtype = extra
    param = next(model.parameters())
    text_config = model.config.get_text_config()
    vocab_size = text_config.vocab_size
    max_model_len = _max_model_len(model, config, block_manager)
    drafter = _setup_drafter(model, tokenizer, config, target_path, drafter, plugins, runner)
    draft_tree = _draft_tree(config.speculative_config, drafter)
    kernels = plan_kernels(config, model, runner, drafter, dtype)
    graph_reports = capture_cuda_graphs(config, runner, drafter, max_model_len)
    speculation = _speculation_stage(
        model, vocab_size, config, drafter, draft_tree, plugins, runner, block_manager
    )
    if speculation.policy is not None:
        kernels.forward_cost = speculation.policy.cost_model
    eos_token_ids = _eos_token_ids(model, tokenizer)
    guided = GuidedDecodingStage(
        tokenizer,
        vocab_size,
        eos_token_ids,
        config.max_num_tokens,
        param.device,
        config.guided_json_max_whitespace,
        config.guided_unsupported,
        config.grammar_compile_timeout_s,
    )
    outputs = OutputProcessor(tokenizer, max_model_len, eos_token_ids)
    scheduler = Scheduler(block_manager, config.max_batch_size, config.max_num_tokens)
    if config.enable_prefix_caching and runner.capture_layers:
        scheduler.reuses_prefixes = False
        logger.info("prefix caching: pages are not reused (every position's hidden states are captured)")
    capture = tuple(config.capture_hidden_layers)
    core = EngineCore(runner, scheduler, speculation, guided, outputs, max_model_len, vocab_size, capture)
    return core, SetupReport(dtype, quantization, model_impl, kernels, graph_reports)


def capture_cuda_graphs(
    config: ExecutorConfig, runner: ModelRunner, drafter: Drafter | None, max_model_len: int, backend=None
) -> list[GraphCaptureReport]:
    """On CUDA with ``cuda_graphs`` on: capture the target's decode/verify forward (query lengths 1,
    1 + max drafts, and 1 + the longest grammar-forced run) and the drafter's models, into one memory
    pool. Elsewhere nothing is captured and every forward runs eagerly. ``backend``: another capture
    backend (`cuda_graphs.EagerReplay` runs the captured path on any device)."""
    if backend is None:
        if runner.device.type != "cuda" or not config.cuda_graphs:
            return []
        if config.device_map is not None:  # a graph captures one device's stream
            reason = "device_map spreads the model over devices"
            return [GraphCaptureReport("target", error=reason)]
        backend = CudaGraphCapture(runner.device)
    max_draft_len = drafter.max_draft_len if drafter is not None else 0
    bs = config.block_size
    shapes = GraphShapes.for_model(
        config.max_batch_size,
        (1, 1 + max_draft_len, 1 + MAX_FORCED_TOKENS),
        -(-max_model_len // bs),
        bs,
        config.max_num_tokens,
    )
    reports = [runner.capture_graphs(shapes, backend, "target")]
    if drafter is not None:
        reports += drafter.capture_cuda_graphs(backend, config.max_batch_size, max_model_len)
    return reports


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_target(model, tokenizer, config: ExecutorConfig, dtype: str):
    """(model, tokenizer, the path it was loaded from or None, its QuantizationReport or None, which
    forward runs and why). ``model_impl`` converts a supported model to the own decoder before
    quantization, so the quantized layers are the fused ones."""
    from .layers.quantized.quantization import quantize_model
    from .model.model_loader import check_device, load_model, loading_logger

    if isinstance(model, torch.nn.Module):
        # a module runs where the caller put it, unless the config names a device: then it moves there
        # (in place, as ``module.to`` does, and is quantized in place); ``dtype`` applies only to the
        # models the executor loads. Layers an earlier CPU executor packed for oneDNN or MKL go back to
        # dense ``nn.Linear`` first: ``module.to`` moves neither the packed copies nor the dense weight
        # they keep, so a model packed on the CPU and then moved to CUDA kept CPU weights.
        unpack_linears(model)
        if config.device != "auto":
            check_device(config.device)
            model.to(config.device)
        model_impl = resolve_model_impl(model, config.model_impl)
        report = quantize_model(model, config.quantization) if config.quantization else None
        return model.eval(), tokenizer, None, report, model_impl

    loaded = load_model(
        model if model is not None else config.model,
        dtype=dtype,
        device=str(resolve_device(config.device)),
        device_map=config.device_map,
        cache_dir=config.cache_dir,
        progress=config.progress,
        quantization=config.quantization,
        model_impl=config.model_impl,
        quantized_kernel=config.quantized_kernel,
    )
    loading_logger.info("model: %s", loaded.source)
    path = loaded.gguf_path or Path(model if model is not None else config.model)
    return loaded.model, tokenizer or loaded.tokenizer, path, loaded.quantization, loaded.model_impl


def _eos_token_ids(model, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    for value in (
        getattr(model.generation_config, "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(value)
    return frozenset(ids)


def _max_model_len(model, config: ExecutorConfig, block_manager: BlockManager) -> int:
    """The model's context (or ``max_model_len``), capped by the KV pool. Draft slots take no room
    from it: near the cap a request drafts fewer tokens instead of being refused."""
    text_config = model.config.get_text_config()
    model_len = config.max_model_len or getattr(text_config, "max_position_embeddings", None) or 2**31
    pool_len = block_manager.capacity_tokens
    if pool_len < model_len:
        logger.info(
            "context capped at %d tokens by the KV pool (%d pages)", pool_len, block_manager.num_blocks
        )
    return min(model_len, pool_len)


def _setup_drafter(model, tokenizer, config, target_path, drafter, plugins, runner) -> Drafter | None:
    """The drafter (the one passed in, or built from the config's choice), registered, with the
    target's hidden states it reads captured. It is bound later (`_speculation_stage`)."""
    spec = config.speculative_config
    if isinstance(drafter, DrafterChoice):
        vocab_size = model.config.get_text_config().vocab_size
        context = DrafterContext(model, tokenizer, vocab_size, config, target_path, spec.max_draft_len)
        drafter = drafter.build(context)
    if drafter is None:
        return None
    if spec is not None and spec.draft_tree:
        refuse_trees_here(model, runner)
    plugins.register(drafter, name="drafter")
    runner.capture(tuple(drafter.hidden_state_layers))
    return drafter


def refuse_trees_here(model, runner) -> None:
    """ValueError where token trees do not run yet: on CUDA (its attention kernels and graphs have no
    tree mask), and on a target with sliding-window attention (its window is cut by cache slot, and a
    tree node's slot is not its position)."""
    if next(model.parameters()).device.type != "cpu":
        raise ValueError(
            "speculative_config.draft_tree runs on the CPU only (the CUDA kernels have no tree mask)"
        )
    text_config = model.config.get_text_config()
    window = getattr(text_config, "sliding_window", None)
    if window and getattr(text_config, "use_sliding_window", True):
        raise ValueError(
            "speculative_config.draft_tree: this model has sliding-window attention, which trees do not run with yet"
        )
    if not hasattr(runner, "kv_cache"):
        raise ValueError("speculative_config.draft_tree does not run with tensor parallelism yet")


def _draft_tree(spec, drafter):
    """The `TreeShape` the drafter drafts within under ``speculative_config.draft_tree``, else None."""
    if drafter is None or spec is None or not spec.draft_tree:
        return None
    return resolve_draft_tree(spec.draft_tree, drafter)


def _speculation_stage(
    model, vocab_size: int, config: ExecutorConfig, drafter, draft_tree, plugins, runner, block_manager
) -> SpeculationStage:
    """The stage, with the drafter bound and the draft-length policy; ``auto`` and ``confidence`` time the
    target's forwards as they will run (after graph capture, so a replayed forward is what is measured)."""
    spec = config.speculative_config
    if drafter is None:
        return SpeculationStage(plugins, None, spec, vocab_size)
    policy_name = spec.draft_len_policy if spec is not None else "fixed"
    cost = None
    if policy_name != "fixed":
        cost = ForwardCostModel.linear()
        if policy_name in ("auto", "confidence"):
            cost = target_forward_cost(config, model, runner, block_manager)
    stops_itself = policy_name == "confidence" and drafter.reports_confidence
    if policy_name == "confidence" and not stops_itself:
        logger.info(
            "%s reports no draft confidence: draft_len_policy 'confidence' runs as 'auto'",
            type(drafter).__name__,
        )
    confidence_stop = ConfidenceStop(cost) if stops_itself else None  # the drafter ends each chain itself
    drafter.bind_target(
        DraftBinding(
            runner,
            block_manager,
            use_grammar_masks=config.draft_side_grammar_masks,
            draft_tree=draft_tree,
            confidence_stop=confidence_stop,
        )
    )
    policy = None
    if cost is not None and not stops_itself:
        policy = DraftLengthPolicy(drafter.max_draft_len, cost)
        if drafter.initial_acceptance is not None:  # the drafter's own estimate (LayerSkip measures one)
            policy.initial_rate = drafter.initial_acceptance
    return SpeculationStage(plugins, drafter, spec, vocab_size, policy, config.drafter_timeout_s)
