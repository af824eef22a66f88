"""A rank's shard read layer by layer from a safetensors checkpoint (`rank_loading.load_shard`) is the
shard of the whole model loaded, converted, quantized and sliced (`sharding.shard_model`): the same
tensors on every rank (float64 tiny Llama, Qwen2, Gemma2 and Gemma3, dense, int8 and int4, KV-head
groups split evenly and unevenly) and, as one rank of one, the same logits as the whole model; what it
cannot read so gets None."""

from __future__ import annotations

import pytest
import torch
from specexec.executor.layers.quantized.quantization import quantize_model
from specexec.executor.model.decoder.convert import convert_to_own_decoder
from specexec.executor.model.forward_io import SequenceInput
from specexec.executor.model.kv_cache import KVCache, KVCacheSpec
from specexec.executor.model.model_runner import ModelRunner
from specexec.executor.parallel.rank_loading import load_shard
from specexec.executor.parallel.sharding import shard_model
from tensor_parallel_runs import INT4_SHAPES, UNEVEN
from tiny_models import make_prompts, make_tiny_model


class OneRank:
    """The collectives of a world of one: nothing to add or gather."""

    def all_reduce(self, x):
        return x

    def all_gather(self, x):
        return x


def saved_and_whole(tmp_path, arch: str, quantization: str | None, **shapes):
    """The tiny model saved as safetensors, and the same model loaded whole from there (as the front
    loads it), converted and quantized."""
    from transformers import AutoModelForCausalLM

    _, model = make_tiny_model(arch, **shapes)
    model.save_pretrained(tmp_path)
    whole = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    convert_to_own_decoder(whole)
    if quantization:
        quantize_model(whole, quantization)
    return whole


CASES = [(arch, None, {}) for arch in ("llama", "qwen2", "gemma2", "gemma3")]
CASES += [
    ("qwen2", "int8", {}),
    ("gemma3", "int8", {}),
    ("llama", "int4", INT4_SHAPES),
    ("qwen2", None, UNEVEN),
]


@pytest.mark.parametrize(("arch", "quantization", "shapes"), CASES)
def test_each_ranks_shard_read_layer_by_layer_is_the_whole_models_shard(tmp_path, arch, quantization, shapes):
    whole = saved_and_whole(tmp_path, arch, quantization, **shapes)
    for rank in (0, 1):
        want = shard_model(whole, rank, 2, None).state_dict()
        got = load_shard(tmp_path, torch.float64, quantization, rank, 2, None).state_dict()
        assert got.keys() == want.keys()
        for name, tensor in want.items():
            assert torch.equal(got[name], tensor), f"rank {rank}: {name}"


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_one_rank_of_one_gives_the_whole_models_logits(tmp_path, arch):
    """Buffers the state dict does not hold (rotary tables, Gemma's embedding scale) come out right."""
    whole = saved_and_whole(tmp_path, arch, None)
    shard = load_shard(tmp_path, torch.float64, None, 0, 1, OneRank())
    spec = KVCacheSpec.from_model_config(whole.config, torch.float64)
    prompt = make_prompts(1, 13, seed=3)[0]
    logits = []
    for model in (whole, shard):
        runner = ModelRunner(model, KVCache(spec, 8, 4, torch.device("cpu")), 32)
        logits.append(runner.forward([SequenceInput(prompt, 0, [0, 1, 2, 3], 13)]).logits)
    assert torch.equal(logits[1], logits[0])


def test_what_it_cannot_read_layer_by_layer_gets_none(tmp_path):
    saved_and_whole(tmp_path, "llama", None)
    assert load_shard(tmp_path, torch.float64, "gguf", 0, 2, None) is None, "a GGUF's own codes"
    assert load_shard(tmp_path / "model.gguf", torch.float64, None, 0, 2, None) is None, "not a directory"
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert load_shard(tmp_path, torch.float64, None, 0, 2, None) is None, "a name the model has is missing"
