"""Bad requests finish with finish_reason "error" and a clear message, without disturbing the good
requests of the same `run()`; bad configs and model paths raise ValueErrors that name the problem."""

from __future__ import annotations

import pytest
import torch
from factories import greedy, tiny_executor
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.request import FinishReason, Request
from specexec.executor.executor import Executor
from specexec.executor.model.model_loader import ModelLoadError
from specexec.sampling import SamplingParams
from tiny_models import make_tiny_model, make_tiny_tokenizer

MAX_MODEL_LEN = 16
MAX_TOKENS = 4


def bounded_executor(**config_overrides) -> Executor:
    """The tiny llama with its tokenizer, a context of MAX_MODEL_LEN positions and small pools."""
    settings = dict(num_kv_blocks=32, max_num_tokens=64, max_model_len=MAX_MODEL_LEN)
    return tiny_executor(tokenizer=make_tiny_tokenizer(), **{**settings, **config_overrides})


GOOD_REQUESTS = {
    "good-text": Request("w1 w2 w3", greedy(MAX_TOKENS)),
    "good-ids": Request([10, 20, 30, 40, 50], greedy(MAX_TOKENS)),
    "good-chat": Request(
        [{"role": "system", "content": "w7"}, {"role": "user", "content": "w8 w9"}], greedy(MAX_TOKENS)
    ),
}

#: request id -> (request, words the error message must contain)
BAD_REQUESTS = {
    "empty-text": (Request("", greedy(MAX_TOKENS)), ["empty prompt"]),
    "empty-ids": (Request([], greedy(MAX_TOKENS)), ["prompt must be non-empty"]),
    "too-long": (
        Request(list(range(20)), greedy(MAX_TOKENS)),
        ["20 tokens", f"context holds {MAX_MODEL_LEN}"],
    ),
    "exactly-context": (Request(list(range(MAX_MODEL_LEN)), greedy(MAX_TOKENS)), [f"{MAX_MODEL_LEN} tokens"]),
    "max-tokens-0": (Request([1, 2, 3], SamplingParams(max_tokens=0)), ["max_tokens", "> 0", "0"]),
    "negative-temperature": (
        Request([1, 2, 3], greedy(MAX_TOKENS, temperature=-1.0)),
        ["temperature", "-1.0"],
    ),
    "wizard-role": (
        Request([{"role": "user", "content": "w1"}, {"role": "wizard", "content": "w2"}], greedy(MAX_TOKENS)),
        ["chat message 1", "unknown role 'wizard'", "allowed: system, user, assistant, tool"],
    ),
    "message-without-content": (Request([{"role": "user"}], greedy(MAX_TOKENS)), ["'role' and 'content'"]),
    "out-of-vocab": (
        Request([5, 256, 7, 1000], greedy(MAX_TOKENS)),
        ["outside the vocabulary 0..255", "[256, 1000]"],
    ),
    "negative-id": (Request([5, -1], greedy(MAX_TOKENS)), ["outside the vocabulary", "[-1]"]),
    "mixed-list": (Request([5, "w1"], greedy(MAX_TOKENS)), ["only token ids (int) or only chat messages"]),
    "bool-ids": (Request([True, False], greedy(MAX_TOKENS)), ["only token ids (int)"]),
    "not-a-prompt": (Request(42, greedy(MAX_TOKENS)), ["prompt must be non-empty text", "int"]),
    "params-not-sampling-params": (
        Request([1, 2], {"max_tokens": 3}),
        ["sampling_params must be SamplingParams"],
    ),
}


def run_alone(prompt, params=None) -> list[int]:
    (out,) = bounded_executor().run([Request(prompt, params or greedy(MAX_TOKENS))])
    assert out.finish_reason is FinishReason.LENGTH
    return out.token_ids


def test_bad_requests_fail_alone_while_good_ones_in_the_same_run_complete():
    executor = bounded_executor()
    requests = []
    for name, request in GOOD_REQUESTS.items():
        requests.append(Request(request.prompt, request.sampling_params, request_id=name))
    for name, (request, _) in BAD_REQUESTS.items():
        requests.append(Request(request.prompt, request.sampling_params, request_id=name))
    # interleave good and bad so a bad one never sits only at the end
    requests = requests[::2] + requests[1::2]

    outputs = {o.request_id: o for o in executor.run(requests)}

    assert list(outputs) == [r.request_id for r in requests]
    for name, (_, words) in BAD_REQUESTS.items():
        out = outputs[name]
        assert out.finish_reason is FinishReason.ERROR, name
        assert out.token_ids == [] and out.text == "", name
        for word in words:
            assert word in out.error, f"{name}: {word!r} not in {out.error!r}"
    for name, request in GOOD_REQUESTS.items():
        out = outputs[name]
        assert out.finish_reason is FinishReason.LENGTH, (name, out.error)
        assert out.error is None
        assert len(out.token_ids) == MAX_TOKENS
        assert out.token_ids == run_alone(request.prompt), f"{name} was disturbed by the bad requests"
    bm = executor.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert not executor.core.scheduler.has_unfinished()


def test_good_requests_render_as_expected():
    executor = bounded_executor()
    text, ids, chat = executor.run(list(r for r in GOOD_REQUESTS.values()))
    tokenizer = make_tiny_tokenizer()
    assert text.prompt_token_ids == tokenizer("w1 w2 w3")["input_ids"]
    assert ids.prompt_token_ids == [10, 20, 30, 40, 50]
    words = ["<|system|>", "w7", "<|end|>", "<|user|>", "w8", "w9", "<|end|>", "<|assistant|>"]
    assert chat.prompt_token_ids == [tokenizer.convert_tokens_to_ids(w) for w in words]
    assert text.text == tokenizer.decode(text.token_ids)


def test_error_outputs_carry_metrics_and_no_timings_of_generation():
    (out,) = bounded_executor().run([Request("", greedy(MAX_TOKENS), request_id="e")])
    assert out.finish_reason is FinishReason.ERROR
    assert out.metrics.num_output_tokens == 0
    assert out.metrics.num_forwards == 0
    assert out.metrics.time_to_first_token is None


def test_prompt_of_max_model_len_minus_one_tokens_gets_one_token():
    (out,) = bounded_executor().run([list(range(MAX_MODEL_LEN - 1))], greedy(MAX_TOKENS))
    assert out.finish_reason is FinishReason.LENGTH
    assert len(out.token_ids) == 1


def test_text_prompt_that_tokenizes_to_nothing_is_an_error():
    """Whitespace has no tokens in the tiny tokenizer: such a request has nothing to condition on
    and must not run (it would read another request's logits)."""
    executor = bounded_executor()
    blank, good = executor.run(
        [Request("   ", greedy(MAX_TOKENS), request_id="blank"), Request("w1 w2", greedy(MAX_TOKENS))]
    )
    assert blank.finish_reason is FinishReason.ERROR
    assert blank.error and "empty" in blank.error
    assert good.token_ids == run_alone("w1 w2")


def test_text_prompt_with_ids_beyond_the_model_vocabulary_is_an_error():
    """A tokenizer with more tokens than the model's embedding (added tokens, no resize): the text
    request whose ids the model cannot embed fails alone instead of crashing the whole batch."""
    _, model = make_tiny_model("llama")  # vocab 256
    config = ExecutorConfig(num_kv_blocks=32, block_size=4, dtype="float64", device="cpu")
    executor = Executor(model, config, tokenizer=make_tiny_tokenizer(300))
    assert executor.tokenizer("w290")["input_ids"] == [296]
    bad, good = executor.run([Request("w290 w1", greedy(MAX_TOKENS)), Request("w1 w2", greedy(MAX_TOKENS))])
    assert bad.finish_reason is FinishReason.ERROR
    assert "outside the vocabulary" in bad.error and "296" in bad.error
    assert good.token_ids == run_alone("w1 w2")
    assert executor.block_manager.num_free_blocks == executor.block_manager.num_blocks


def test_duplicate_request_id_is_an_error_for_the_second_request_only():
    executor = bounded_executor()
    requests = [
        Request([1, 2, 3], greedy(MAX_TOKENS), request_id="same"),
        Request([4, 5, 6, 7], greedy(MAX_TOKENS), request_id="same"),
    ]
    first, second = executor.run(requests)
    assert first.finish_reason is FinishReason.LENGTH
    assert first.token_ids == run_alone([1, 2, 3])
    assert second.finish_reason is FinishReason.ERROR
    assert "same" in second.error
    assert executor.block_manager.num_free_blocks == executor.block_manager.num_blocks


def test_chat_template_that_raises_is_an_error_for_that_request_only():
    """Real chat templates reject some conversations with `raise_exception(...)` (a jinja2
    TemplateError, not a ValueError); that must fail the one request, not the whole run()."""
    _, model = make_tiny_model("llama")
    tokenizer = make_tiny_tokenizer()
    tokenizer.chat_template = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('Conversation must start with a user message') }}{% endif %}"
    ) + tokenizer.chat_template
    executor = Executor(
        model, ExecutorConfig(num_kv_blocks=32, block_size=4, dtype="float64"), tokenizer=tokenizer
    )
    good, bad = executor.run([[1, 2, 3], [{"role": "assistant", "content": "w1"}]], greedy(MAX_TOKENS))
    assert good.finish_reason is FinishReason.LENGTH
    assert bad.finish_reason is FinishReason.ERROR
    assert "must start with a user message" in bad.error
    assert not executor.core.scheduler.has_unfinished()


def test_chat_prompt_without_a_chat_template_is_an_error():
    _, model = make_tiny_model("llama")
    executor = Executor(model, ExecutorConfig(num_kv_blocks=16, block_size=4, dtype="float64"))
    chat, text, ids = executor.run([[{"role": "user", "content": "w1"}], "w1 w2", [1, 2]], greedy(MAX_TOKENS))
    assert chat.finish_reason is FinishReason.ERROR and "chat template" in chat.error
    assert text.finish_reason is FinishReason.ERROR and "needs a tokenizer" in text.error
    assert ids.finish_reason is FinishReason.LENGTH


# ---- configuration ---------------------------------------------------------------------------------------


def test_unknown_config_key_from_dict_names_it_and_lists_allowed_keys():
    with pytest.raises(ValueError, match="unknown config key 'max_batch'") as info:
        ExecutorConfig.from_dict({"max_batch": 4})
    for key in ("max_batch_size", "max_num_tokens", "block_size", "dtype", "num_kv_blocks"):
        assert key in str(info.value)


def test_unknown_config_key_from_yaml_names_it_and_lists_allowed_keys(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("dtype: float64\nblock_size: 4\nkv_blocks: 12\n")
    with pytest.raises(ValueError, match="unknown config key 'kv_blocks'; allowed: .*num_kv_blocks"):
        ExecutorConfig.from_yaml(path)


def test_good_yaml_config_loads(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("dtype: float64\nblock_size: 4\nnum_kv_blocks: 12\ncapture_hidden_layers: [0, 2]\n")
    config = ExecutorConfig.from_yaml(path)
    assert (config.dtype, config.block_size, config.num_kv_blocks) == ("float64", 4, 12)
    assert config.capture_hidden_layers == [0, 2]


def test_unreadable_or_invalid_yaml_raises_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read config file"):
        ExecutorConfig.from_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("dtype: [float64\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        ExecutorConfig.from_yaml(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- dtype\n- block_size\n")
    with pytest.raises(ValueError, match="must be a mapping"):
        ExecutorConfig.from_yaml(listing)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("dtype", "int8"),
        ("max_batch_size", 0),
        ("max_batch_size", 2.5),
        ("max_batch_size", True),
        ("max_num_tokens", -1),
        ("block_size", "16"),
        ("device", "tpu"),
        ("max_model_len", 1),
        ("kv_cache_memory_gb", 0),
        ("kv_cache_memory_gb", float("nan")),
        ("kv_cache_memory_gb", float("inf")),
        ("kv_cache_memory_gb", True),
        ("num_kv_blocks", 0),
        ("capture_hidden_layers", [0, -1]),
        ("capture_hidden_layers", 3),
        ("model", 5),
    ],
)
def test_bad_config_value_raises_value_error_naming_the_key(key, value):
    with pytest.raises(ValueError, match=f"config key '{key}': got"):
        ExecutorConfig(**{key: value})
    with pytest.raises(ValueError, match=f"config key '{key}': got"):
        ExecutorConfig.from_dict({key: value})


def test_bad_config_value_in_yaml_names_the_key(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("max_batch_size: 0\n")
    with pytest.raises(ValueError, match="config key 'max_batch_size': got 0; allowed: an integer > 0"):
        ExecutorConfig.from_yaml(path)


def test_unknown_model_path_raises_model_load_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ModelLoadError, match="does not exist") as info:
        Executor(model=str(missing))
    assert str(missing) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_directory_without_config_raises_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="has no config.json"):
        Executor(model=str(tmp_path), config=ExecutorConfig(device="cpu"))


def test_run_accepts_a_generator_and_keeps_request_order():
    executor = bounded_executor()
    prompts = [[3, 4], [5], [6, 7, 8]]
    outputs = executor.run((p for p in prompts), greedy(MAX_TOKENS))
    assert [o.prompt_token_ids for o in outputs] == prompts
    assert torch.tensor([len(o.token_ids) for o in outputs]).eq(MAX_TOKENS).all()
