"""The GGUFs people run load right: tiny random files of each family (`gguf_files.py`: Llama 3.1, Qwen2.5
with its own head and with a tied one, Mistral, Gemma 2 and 3), written as llama.cpp's converter writes
them, load as the model they were written from -- the same logits through transformers' modules and
through specexec's own decoder -- with a tokenizer that round-trips, the file's chat template, and the
stop tokens llama.cpp stops on (a Llama 3 file whose EOS is ``<|end_of_text|>`` stops on ``<|eot_id|>``)."""

from __future__ import annotations

import logging

import jinja2
import pytest
import torch
from factories import tiny_config
from gguf_files import FAMILIES, make_source_model, write_gguf
from specexec import Executor, ExecutorConfig, FinishReason, Request, SamplingParams
from specexec.executor.model.forward_io import SequenceInput
from specexec.executor.model.gguf_metadata import GGUFMetadata, apply_llama_cpp_config_inplace
from specexec.executor.model.model_loader import TOKENIZER_PROBE, ModelLoadError, load_model
from tiny_models import hf_greedy
from transformers import Gemma2Config, Qwen2Config

#: longer than the sliding window (8) of the Gemma families; no control token among them
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33]
#: the tokens each family's file stops on in llama.cpp: its EOS, and those named end-of-turn or
#: end-of-message in the metadata or by their text
STOP_TOKENS = {
    "llama3": ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    "qwen2": ("<|im_end|>", "<|endoftext|>"),
    "qwen2-tied": ("<|im_end|>", "<|endoftext|>"),
    "mistral": ("</s>",),
    "gemma2": ("<eos>", "<end_of_turn>"),
    "gemma3": ("<eos>", "<end_of_turn>"),
}
#: float64 throughout; Gemma's norm weights lose their last float32 bits to the converter's ``1 + w``
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def gguf_config(tmp_path, **overrides) -> ExecutorConfig:
    """`tiny_config` for a GGUF file converted into ``tmp_path``'s cache, on the own decoder, small pools."""
    settings = dict(
        cache_dir=str(tmp_path / "cache"),
        progress=False,
        model_impl="specexec",
        num_kv_blocks=32,
        max_num_tokens=64,
        max_batch_size=2,
    )
    return tiny_config(**{**settings, **overrides})


def own_decoder_logits(executor: Executor, prompt: list[int]) -> torch.Tensor:  # [len(prompt), vocab]
    bm = executor.block_manager
    bm.allocate("s", len(prompt))
    out = executor.core.runner.forward([SequenceInput(prompt, 0, bm.block_tables["s"], len(prompt))])
    bm.free("s")
    return out.logits


@pytest.mark.parametrize("family", FAMILIES)
def test_the_file_gives_its_source_models_logits_on_both_decoders(family, tmp_path):
    path = tmp_path / f"{family}.gguf"
    source, _ = write_gguf(path, family)
    with torch.no_grad():
        want = source.double()(torch.tensor([PROMPT])).logits[0]  # [13, vocab]
    loaded = load_model(path, dtype="float64", cache_dir=tmp_path / "cache", progress=False)
    assert loaded.model.config.tie_word_embeddings == source.config.tie_word_embeddings
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(torch.tensor([PROMPT])).logits[0], want, **TOLERANCE)
    executor = Executor(str(path), gguf_config(tmp_path))  # from the conversion cache
    assert executor.setup.model_impl.impl == "specexec"
    torch.testing.assert_close(own_decoder_logits(executor, PROMPT), want, **TOLERANCE)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tokenizer_round_trips_and_chat_prompts_use_the_files_template(family, tmp_path):
    path = tmp_path / f"{family}.gguf"
    _, vocab = write_gguf(path, family)
    executor = Executor(str(path), gguf_config(tmp_path))
    tokenizer = executor.tokenizer
    ids = tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False)
    assert tokenizer.decode(ids) == TOKENIZER_PROBE and vocab.id("Hello") in ids  # the merges apply
    template = FAMILIES[family].chat_template
    assert tokenizer.chat_template == template
    messages = [{"role": "user", "content": "Hello world!"}]
    out = executor.run([Request(messages, SamplingParams(max_tokens=1, ignore_eos=True))])[0]
    assert out.error is None, out.error
    specials = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}
    text = jinja2.Template(template).render(messages=messages, add_generation_prompt=True, **specials)
    assert tokenizer.decode(out.prompt_token_ids) == text
    assert out.prompt_token_ids == tokenizer.encode(text, add_special_tokens=False)
    controls = [token for token in FAMILIES[family].control_tokens if token in text]
    assert controls and all(vocab.id(token) in out.prompt_token_ids for token in controls)  # each one id


@pytest.mark.parametrize("family", FAMILIES)
def test_the_engine_stops_on_the_tokens_llama_cpp_stops_on(family, tmp_path):
    path = tmp_path / f"{family}.gguf"
    _, vocab = write_gguf(path, family)
    executor = Executor(str(path), gguf_config(tmp_path))
    want = {vocab.id(token) for token in STOP_TOKENS[family]}
    assert executor.tokenizer.eos_token_id == vocab.id(FAMILIES[family].special["eos"])
    assert executor.core.outputs.eos_token_ids == want
    again = load_model(path, cache_dir=tmp_path / "cache", progress=False)
    assert "cached conversion" in again.source and set(again.model.generation_config.eos_token_id) == want


def test_a_llama3_file_whose_eos_is_end_of_text_stops_on_eot_id(tmp_path):
    """The source model relabelled so that a token it picks greedily, after others, is ``<|eot_id|>``
    (their embedding and head rows swapped): the run ends there, by that stop token."""
    family = FAMILIES["llama3"]
    vocab = family.vocab()
    eot, eos = vocab.id("<|eot_id|>"), vocab.id("<|end_of_text|>")
    source = make_source_model(family).double()
    greedy = hf_greedy(source, PROMPT, 8)
    assert eot not in greedy and eos not in greedy
    k = next(i for i in range(1, len(greedy)) if greedy[i] not in greedy[:i] + PROMPT)  # a new token
    with torch.no_grad():
        for weight in (source.model.embed_tokens.weight, source.lm_head.weight):
            weight[[greedy[k], eot]] = weight[[eot, greedy[k]]]
    path = tmp_path / "llama3.gguf"
    write_gguf(path, "llama3", source.float())
    executor = Executor(str(path), gguf_config(tmp_path))
    assert executor.tokenizer.eos_token_id == eos
    out = executor.run([Request(PROMPT, SamplingParams(max_tokens=8))])[0]
    assert out.token_ids == greedy[:k] + [eot] and out.finish_reason is FinishReason.STOP


# ---- what the loader refuses or cannot apply ----------------------------------------------------------


def test_rope_freqs_that_are_not_llama3s_scaling_are_refused(tmp_path):
    family = FAMILIES["llama3"]
    source = make_source_model(family)
    source.config.rope_parameters = {**source.config.rope_parameters, "low_freq_factor": 2.0}
    path = tmp_path / "llama3.gguf"
    write_gguf(path, "llama3", source)
    with pytest.raises(ModelLoadError, match="rope_freqs tensor .* is not Llama 3's rope scaling"):
        load_model(path, cache_dir=tmp_path / "cache", progress=False)


def test_gemmas_27b_models_take_llama_cpps_attention_scale_of_hidden_over_heads():
    metadata = GGUFMetadata("gemma2", {}, [], None)
    config = Gemma2Config(num_hidden_layers=46, hidden_size=4608, num_attention_heads=32, head_dim=128)
    assert "query_pre_attn_scalar 144" in "; ".join(apply_llama_cpp_config_inplace(config, metadata))
    assert config.query_pre_attn_scalar == 144  # (transformers' default: 256)
    nine_b = Gemma2Config(num_hidden_layers=42, hidden_size=3584, num_attention_heads=16, head_dim=256)
    assert apply_llama_cpp_config_inplace(nine_b, metadata) == [] and nine_b.query_pre_attn_scalar == 256


def test_a_rope_scaling_the_loader_cannot_apply_is_said(caplog):
    values = {"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0}
    config = Qwen2Config()
    with caplog.at_level(logging.WARNING, logger="specexec"):
        assert apply_llama_cpp_config_inplace(config, GGUFMetadata("qwen2", values, [], None)) == []
    assert "rope scaling 'yarn' (factor 4) is not applied" in caplog.text
