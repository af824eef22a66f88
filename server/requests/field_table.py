"""Every request field this server knows, from OpenAI's, vLLM's, SGLang's and llama.cpp's request shapes
for chat, completions and responses, and what is done with each (`FIELDS`; `fields.py` applies it,
docs/serving.md prints it):

- **mapped**: it does what its name says; ``note`` says onto what;
- **default-only**: its other values would change what comes back in a way this server cannot do (beam
  search, a LoRA adapter, llama.cpp's mirostat). At one of ``accepted`` (the field's default where its
  engine defines one) or null it is taken; any other value is a 400 naming it;
- **ignored**: it cannot change what comes out here (a routing hint, a scheduling priority, an id):
  dropped, each name logged once; a *checked* one (``user``) is still checked, a malformed value refused.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

CHAT, COMPLETIONS, RESPONSES = "chat", "completions", "responses"
ENDPOINTS = (CHAT, COMPLETIONS, RESPONSES)
_BOTH = (CHAT, COMPLETIONS)  # the completions endpoints
_ALL = ENDPOINTS


class Action(str, enum.Enum):
    MAPPED = "mapped"
    DEFAULT_ONLY = "default-only"
    IGNORED = "ignored"


@dataclass(frozen=True, slots=True)
class Field:
    """One row: a field, on some endpoints, and what this server does with it."""

    name: str  #: the field's name; ``parent.key`` for a key inside an object field
    action: Action
    endpoints: tuple[str, ...]  #: of `ENDPOINTS`
    origin: str  #: whose request shapes have it: OpenAI, vLLM, SGLang, llama.cpp
    note: str  #: mapped: onto what; default-only: what other values ask for; ignored: why it may be
    accepted: tuple[Any, ...] = ()  #: default-only: the values taken besides null
    is_checked: bool = False  #: ignored: still checked by the parser (a malformed value is a 400)


def _mapped(name: str, on: tuple[str, ...], origin: str, onto: str) -> Field:
    return Field(name, Action.MAPPED, on, origin, onto)


def _default(name: str, on: tuple[str, ...], origin: str, accepted: tuple, asks: str) -> Field:
    return Field(name, Action.DEFAULT_ONLY, on, origin, asks, accepted)


def _ignored(name: str, on: tuple[str, ...], origin: str, why: str, is_checked: bool = False) -> Field:
    return Field(name, Action.IGNORED, on, origin, why, is_checked=is_checked)


_SAMPLING = "`SamplingParams.{}`"
_AS_CHAT = "as on chat: `SamplingParams.{}`"
_GUIDED = "`Request.response_format` (guided decoding: {})"
_NO_IMAGES = "text only here: no image or audio is taken, so it has nothing to act on"
_NO_REASONING = "no reasoning parser here: the reasoning stays in `content`, whatever its value"

FIELDS: tuple[Field, ...] = (
    # ---- OpenAI: the prompt and the model -------------------------------------------------------------
    _mapped("model", _ALL, "OpenAI", "checked against the served model's name (404 when another)"),
    _mapped("messages", (CHAT,), "OpenAI", "the prompt, rendered by the chat template"),
    _mapped("prompt", (COMPLETIONS,), "OpenAI", "the prompt: text, token ids, or a list of those"),
    _mapped("input", (RESPONSES,), "OpenAI", "the chat messages (text, messages, tool items)"),
    _mapped("instructions", (RESPONSES,), "OpenAI", "a system message first"),
    _mapped("previous_response_id", (RESPONSES,), "OpenAI", "the stored conversation goes first"),
    # ---- OpenAI: sampling and stopping -----------------------------------------------------------------
    _mapped("max_tokens", _BOTH, "OpenAI", _SAMPLING.format("max_tokens")),
    _mapped("max_completion_tokens", _BOTH, "OpenAI", _SAMPLING.format("max_tokens")),
    _mapped("max_output_tokens", (RESPONSES,), "OpenAI", _SAMPLING.format("max_tokens")),
    _mapped("temperature", _ALL, "OpenAI", _SAMPLING.format("temperature")),
    _mapped("top_p", _ALL, "OpenAI", _SAMPLING.format("top_p")),
    _mapped("seed", _BOTH, "OpenAI", _SAMPLING.format("seed") + " (sample i of n: seed + i)"),
    _mapped("seed", (RESPONSES,), "vLLM", _AS_CHAT.format("seed")),
    _mapped("stop", _BOTH, "OpenAI", _SAMPLING.format("stop")),
    _mapped("stop", (RESPONSES,), "vLLM", _AS_CHAT.format("stop")),
    _mapped("frequency_penalty", _BOTH, "OpenAI", _SAMPLING.format("frequency_penalty")),
    _mapped("presence_penalty", _BOTH, "OpenAI", _SAMPLING.format("presence_penalty")),
    _mapped("logit_bias", _BOTH, "OpenAI", _SAMPLING.format("logit_bias")),
    _mapped("n", _BOTH, "OpenAI", _SAMPLING.format("n") + " (each sample its own request)"),
    _mapped("logprobs", _BOTH, "OpenAI", _SAMPLING.format("logprobs")),
    _mapped("top_logprobs", (CHAT,), "OpenAI", _SAMPLING.format("logprobs") + " (with logprobs: true)"),
    _default("top_logprobs", (RESPONSES,), "OpenAI", (0,), "log-probabilities in the output items"),
    _mapped("echo", (COMPLETIONS,), "OpenAI", "the prompt (and its log-probabilities) before the text"),
    _mapped("stream", _ALL, "OpenAI", "server-sent events"),
    _mapped("stream_options", _BOTH, "OpenAI", "include_usage, include_obfuscation, continuous_usage_stats"),
    _ignored("stream_options", (RESPONSES,), "OpenAI", "include_obfuscation pads the events only"),
    # ---- OpenAI: formats and tools ---------------------------------------------------------------------
    _mapped("response_format", _BOTH, "OpenAI", _GUIDED.format("its keys below")),
    _mapped(
        "text", (RESPONSES,), "OpenAI", "`text.format` as chat's response_format (json_schema, json_object)"
    ),
    _mapped("text.format", (RESPONSES,), "OpenAI", "text, json_object or json_schema (name, schema, strict)"),
    _default("text.verbosity", (RESPONSES,), "OpenAI", ("medium",), "shorter or longer answers"),
    _mapped("tools", (CHAT, RESPONSES), "OpenAI", "`Request.tools`: the template's tools, calls read back"),
    _mapped("tool_choice", (CHAT, RESPONSES), "OpenAI", "required / a named function: guided decoding"),
    _mapped("parallel_tool_calls", (CHAT, RESPONSES), "OpenAI", "false: at most one call read back"),
    _default("functions", (CHAT,), "OpenAI", (), "the deprecated function calling (send tools)"),
    _default("function_call", (CHAT,), "OpenAI", ("none", "auto"), "a named function (send tool_choice)"),
    # ---- OpenAI: what this server does not do ----------------------------------------------------------
    _default("best_of", (COMPLETIONS,), "OpenAI", (1,), "the best of several samples"),
    _default("best_of", (CHAT,), "vLLM", (1,), "the best of several samples"),
    _default("suffix", (COMPLETIONS,), "OpenAI", ("",), "fill-in-the-middle"),
    _default("store", (CHAT,), "OpenAI", (False,), "a stored chat completion"),
    _mapped("store", (RESPONSES,), "OpenAI", "the response kept for previous_response_id (default true)"),
    _default("service_tier", (CHAT, RESPONSES), "OpenAI", ("auto", "default"), "another processing tier"),
    _default("prediction", (CHAT,), "OpenAI", (), "a predicted output"),
    _default("audio", (CHAT,), "OpenAI", (), "audio output"),
    _default("modalities", (CHAT,), "OpenAI", (["text"],), "audio output"),
    _default("web_search_options", (CHAT,), "OpenAI", (), "web search"),
    _default("reasoning_effort", (CHAT,), "OpenAI", (), "a reasoning budget"),
    _default("verbosity", (CHAT,), "OpenAI", ("medium",), "shorter or longer answers"),
    _default("background", (RESPONSES,), "OpenAI", (False,), "a response run in the background"),
    _default("conversation", (RESPONSES,), "OpenAI", (), "a stored conversation"),
    _default("prompt", (RESPONSES,), "OpenAI", (), "a stored prompt template"),
    _default("truncation", (RESPONSES,), "OpenAI", ("disabled",), "the input cut to fit the context"),
    _default("include", (RESPONSES,), "OpenAI", ([],), "extra output (log-probabilities, ...)"),
    _default("reasoning", (RESPONSES,), "OpenAI", ({},), "a reasoning budget or summary"),
    _default("max_tool_calls", (RESPONSES,), "OpenAI", (), "a bound on built-in tool calls"),
    _ignored("user", _ALL, "OpenAI", "the end user's id: checked, echoed, never read by the model", True),
    _ignored("metadata", _BOTH, "OpenAI", "stored with a stored completion; nothing is stored here", True),
    _mapped("metadata", (RESPONSES,), "OpenAI", "checked and echoed in the response object"),
    _ignored("prompt_cache_key", _ALL, "OpenAI", "a cache-routing hint: the prefix cache is content-keyed"),
    _ignored("prompt_cache_retention", _ALL, "OpenAI", "how long a cached prefix is kept"),
    _ignored("safety_identifier", _ALL, "OpenAI", "the end user's id, for abuse detection"),
    # ---- vLLM ------------------------------------------------------------------------------------------
    _mapped("top_k", _BOTH, "vLLM", _SAMPLING.format("top_k") + " (-1 or 0: off)"),
    _mapped("top_k", (RESPONSES,), "vLLM", _AS_CHAT.format("top_k")),
    _mapped("min_p", _BOTH, "vLLM", _SAMPLING.format("min_p")),
    _mapped("repetition_penalty", _BOTH, "vLLM", _SAMPLING.format("repetition_penalty")),
    _mapped("repetition_penalty", (RESPONSES,), "vLLM", _AS_CHAT.format("repetition_penalty")),
    _mapped("ignore_eos", _ALL, "vLLM", _SAMPLING.format("ignore_eos")),
    _mapped("min_tokens", _BOTH, "vLLM", _SAMPLING.format("min_tokens")),
    _mapped("stop_token_ids", _BOTH, "vLLM", _SAMPLING.format("stop_token_ids")),
    _mapped("prompt_logprobs", _BOTH, "vLLM", _SAMPLING.format("prompt_logprobs") + " (not streamed)"),
    _mapped("add_special_tokens", _BOTH, "vLLM", "`Request.add_special_tokens` (tokenization)"),
    _mapped("chat_template_kwargs", (CHAT,), "vLLM", "`Request.chat_template_kwargs`: template variables"),
    _mapped("cache_salt", _ALL, "vLLM", "`Request.cache_salt`: the tenant's prefix-cache namespace"),
    _mapped("structured_outputs", _ALL, "vLLM", _GUIDED.format("its keys below")),
    _mapped("structured_outputs.json", _ALL, "vLLM", _GUIDED.format("a JSON schema")),
    _mapped("structured_outputs.regex", _ALL, "vLLM", _GUIDED.format("a regex")),
    _mapped("structured_outputs.choice", _ALL, "vLLM", _GUIDED.format("one of the strings")),
    _mapped("structured_outputs.grammar", _ALL, "vLLM", _GUIDED.format("an EBNF / GBNF grammar")),
    _mapped("structured_outputs.json_object", _ALL, "vLLM", _GUIDED.format("a JSON object")),
    _mapped("structured_outputs.structural_tag", _ALL, "vLLM", _GUIDED.format("a structural tag")),
    _ignored("structured_outputs.disable_fallback", _ALL, "vLLM", "the backend is always xgrammar"),
    _default("structured_outputs.disable_any_whitespace", _ALL, "vLLM", (False,), "compact JSON"),
    _default("structured_outputs.disable_additional_properties", _ALL, "vLLM", (False,), "a stricter schema"),
    _default("structured_outputs.whitespace_pattern", _ALL, "vLLM", (), "JSON whitespace by a regex"),
    _mapped("guided_json", _BOTH, "vLLM", _GUIDED.format("a JSON schema")),
    _mapped("guided_regex", _BOTH, "vLLM", _GUIDED.format("a regex")),
    _mapped("guided_choice", _BOTH, "vLLM", _GUIDED.format("one of the strings")),
    _mapped("guided_grammar", _BOTH, "vLLM", _GUIDED.format("an EBNF / GBNF grammar")),
    _default(
        "guided_whitespace_pattern", _BOTH, "vLLM", (), "JSON whitespace by a regex (xgrammar has none)"
    ),
    _default("guided_decoding_backend", _BOTH, "vLLM", ("xgrammar",), "another grammar backend"),
    _default("structural_tag", _BOTH, "vLLM", (), "the legacy structural tag (send response_format)"),
    _default("use_beam_search", _BOTH, "vLLM", (False,), "beam search"),
    _default("length_penalty", _BOTH, "vLLM", (1.0,), "beam search"),
    _default("early_stopping", _BOTH, "vLLM", (False,), "beam search"),
    _default("include_stop_str_in_output", _BOTH, "vLLM", (False,), "the stop string kept in the text"),
    _default("skip_special_tokens", _BOTH, "vLLM", (True,), "special tokens in the text"),
    _default("spaces_between_special_tokens", _BOTH, "vLLM", (True,), "another detokenization"),
    _default("truncate_prompt_tokens", _BOTH, "vLLM", (), "the prompt cut to its last k tokens"),
    _default("allowed_token_ids", _BOTH, "vLLM", (), "a vocabulary allow-list"),
    _default("bad_words", _BOTH, "vLLM", ([],), "banned words"),
    _default("logits_processors", _BOTH, "vLLM", (), "user logits processors"),
    _default("echo", (CHAT,), "vLLM", (False,), "the last message echoed"),
    _default("add_generation_prompt", (CHAT,), "vLLM", (True,), "no assistant turn opened"),
    _default("continue_final_message", (CHAT,), "vLLM", (False,), "the last message continued"),
    _default("documents", (CHAT,), "vLLM", (), "documents for the template"),
    _default("chat_template", (CHAT,), "vLLM", (), "another chat template"),
    _default("include_reasoning", (CHAT,), "vLLM", (True,), "the reasoning removed from the answer"),
    _default("thinking_token_budget", (CHAT,), "vLLM", (-1,), "a bound on reasoning tokens"),
    _default("mm_processor_kwargs", _ALL, "vLLM", (), "multimodal processing"),
    _default("media_io_kwargs", _ALL, "vLLM", (), "multimodal loading"),
    _default("prompt_embeds", (COMPLETIONS,), "vLLM", (), "a prompt given as embeddings"),
    _default("lora_request", _BOTH, "vLLM", (), "a LoRA adapter"),
    _default("return_tokens_as_token_ids", _BOTH, "vLLM", (False,), "tokens written as token ids"),
    _default("return_token_ids", _BOTH, "vLLM", (False,), "token ids in the response"),
    _default("kv_transfer_params", _ALL, "vLLM", (), "disaggregated prefill"),
    _default("vllm_xargs", _ALL, "vLLM", (), "arguments for custom extensions"),
    _default("repetition_detection", _BOTH, "vLLM", (), "stopping on repeated n-grams"),
    _default("enable_response_messages", (RESPONSES,), "vLLM", (False,), "raw messages in the response"),
    _default("previous_input_messages", (RESPONSES,), "vLLM", (), "a conversation in harmony messages"),
    _default("stop_regex", _BOTH, "SGLang", ([],), "stopping on a regex match"),
    _ignored("priority", _ALL, "vLLM", "orders requests only"),
    _ignored("request_id", _ALL, "vLLM", "names the request; this server's ids are its own"),
    # ---- SGLang ----------------------------------------------------------------------------------------
    _mapped("regex", _BOTH, "SGLang", _GUIDED.format("a regex")),
    _mapped("ebnf", _BOTH, "SGLang", _GUIDED.format("an EBNF grammar")),
    _mapped("json_schema", _BOTH, "SGLang", _GUIDED.format("a JSON schema, an object or its JSON text")),
    _default("no_stop_trim", _BOTH, "SGLang", (False,), "the stop string kept in the text"),
    _default("lora_path", _BOTH, "SGLang", (), "a LoRA adapter"),
    _default("session_id", _BOTH, "SGLang", (), "a stateful session"),
    _default("session_params", _BOTH, "SGLang", (), "a stateful session"),
    _default("return_hidden_states", _BOTH, "SGLang", (False,), "hidden states in the response"),
    _default("return_routed_experts", _BOTH, "SGLang", (False,), "routed experts in the response"),
    _default("return_cached_tokens_details", _BOTH, "SGLang", (False,), "cache details in the response"),
    _default("return_prompt_token_ids", (CHAT,), "SGLang", (False,), "prompt token ids in the response"),
    _default("return_meta_info", (CHAT,), "SGLang", (False,), "meta information in the response"),
    _default("custom_logit_processor", _BOTH, "SGLang", (), "a user logits processor"),
    _default("custom_params", _BOTH, "SGLang", (), "a user logits processor's parameters"),
    _default("input_ids", (CHAT,), "SGLang", (), "a prompt given as token ids, not messages"),
    _default("task", (CHAT,), "SGLang", (), "a DeepSeek-V4 task token"),
    _ignored("separate_reasoning", (CHAT,), "SGLang", _NO_REASONING),
    _ignored("stream_reasoning", (CHAT,), "SGLang", _NO_REASONING),
    _ignored("rid", _BOTH, "SGLang", "names the request; this server's ids are its own"),
    _ignored("extra_key", _BOTH, "SGLang", "a caller's label for the request"),
    _ignored("custom_labels", _BOTH, "SGLang", "labels for metrics"),
    _ignored("ngram_corpus_id", _BOTH, "SGLang", "a drafter's corpus: drafts do not change the output"),
    _ignored("routed_experts_start_len", _BOTH, "SGLang", "acts only with return_routed_experts"),
    _ignored("images_config", _BOTH, "SGLang", _NO_IMAGES),
    _ignored("max_dynamic_patch", (CHAT,), "SGLang", _NO_IMAGES),
    _ignored("min_dynamic_patch", (CHAT,), "SGLang", _NO_IMAGES),
    _ignored("use_audio_in_video", (CHAT,), "SGLang", _NO_IMAGES),
    _ignored("bootstrap_host", _BOTH, "SGLang", "disaggregated prefill: this server computes the prompt"),
    _ignored("bootstrap_port", _BOTH, "SGLang", "disaggregated prefill: this server computes the prompt"),
    _ignored("bootstrap_room", _BOTH, "SGLang", "disaggregated prefill: this server computes the prompt"),
    _ignored("routed_dp_rank", _BOTH, "SGLang", "routing to a data-parallel rank"),
    _ignored("disagg_prefill_dp_rank", _BOTH, "SGLang", "routing to a data-parallel rank"),
    _ignored("data_parallel_rank", _BOTH, "SGLang", "routing to a data-parallel rank"),
    # ---- llama.cpp -------------------------------------------------------------------------------------
    _mapped(
        "n_predict", _BOTH, "llama.cpp", _SAMPLING.format("max_tokens") + " (-1: the rest of the context)"
    ),
    _mapped("grammar", _BOTH, "llama.cpp", _GUIDED.format("a GBNF grammar, read by xgrammar's EBNF")),
    _default("typical_p", _BOTH, "llama.cpp", (1.0,), "locally typical sampling"),
    _default("repeat_penalty", _BOTH, "llama.cpp", (1.0,), "a penalty over the last repeat_last_n tokens"),
    _default("repeat_last_n", _BOTH, "llama.cpp", (64,), "another window for the penalties"),
    _default("dynatemp_range", _BOTH, "llama.cpp", (0.0,), "dynamic temperature"),
    _default("dynatemp_exponent", _BOTH, "llama.cpp", (1.0,), "dynamic temperature"),
    _default("mirostat", _BOTH, "llama.cpp", (0,), "mirostat sampling"),
    _default("mirostat_tau", _BOTH, "llama.cpp", (5.0,), "mirostat sampling"),
    _default("mirostat_eta", _BOTH, "llama.cpp", (0.1,), "mirostat sampling"),
    _default("dry_multiplier", _BOTH, "llama.cpp", (0.0,), "DRY sampling"),
    _default("dry_base", _BOTH, "llama.cpp", (1.75,), "DRY sampling"),
    _default("dry_allowed_length", _BOTH, "llama.cpp", (2,), "DRY sampling"),
    _default("dry_penalty_last_n", _BOTH, "llama.cpp", (-1, 64), "DRY sampling"),
    _default("dry_sequence_breakers", _BOTH, "llama.cpp", (["\n", ":", '"', "*"],), "DRY sampling"),
    _default("xtc_probability", _BOTH, "llama.cpp", (0.0,), "XTC sampling"),
    _default("xtc_threshold", _BOTH, "llama.cpp", (0.1,), "XTC sampling"),
    _default("top_n_sigma", _BOTH, "llama.cpp", (-1.0,), "top-n-sigma sampling"),
    _default("min_keep", _BOTH, "llama.cpp", (0, 1), "a floor on the tokens the filters keep"),
    _default("samplers", _BOTH, "llama.cpp", (), "another order of the samplers"),
    _default("n_probs", _BOTH, "llama.cpp", (0,), "llama.cpp's probabilities (send logprobs)"),
    _default("post_sampling_probs", _BOTH, "llama.cpp", (False,), "probabilities after sampling"),
    _default("n_indent", _BOTH, "llama.cpp", (0,), "a minimum indentation"),
    _default("n_cmpl", _BOTH, "llama.cpp", (1,), "several completions (send n)"),
    _default("t_max_predict_ms", _BOTH, "llama.cpp", (0,), "a time limit on generation"),
    _default("return_tokens", _BOTH, "llama.cpp", (False,), "token ids in the response"),
    _default("response_fields", _BOTH, "llama.cpp", ([],), "another response shape"),
    _default("lora", _BOTH, "llama.cpp", ([],), "LoRA adapters"),
    _default("image_data", _BOTH, "llama.cpp", ([],), "images"),
    _default("reasoning_format", (CHAT,), "llama.cpp", ("none",), "the reasoning parsed out of the answer"),
    _default("thinking_forced_open", (CHAT,), "llama.cpp", (False,), "a reasoning block opened"),
    _default("grammar_lazy", _BOTH, "llama.cpp", (False,), "a grammar started by a trigger"),
    _default("grammar_triggers", _BOTH, "llama.cpp", ([],), "a grammar started by a trigger"),
    _default("preserved_tokens", _BOTH, "llama.cpp", ([],), "a grammar started by a trigger"),
    _ignored("n_keep", _BOTH, "llama.cpp", "acts when the context overflows, which ends a request here"),
    _ignored("cache_prompt", _BOTH, "llama.cpp", "prefix caching: the output is the same"),
    _ignored("n_cache_reuse", _BOTH, "llama.cpp", "prefix caching: the output is the same"),
    _ignored("id_slot", _BOTH, "llama.cpp", "which slot runs the request"),
    _ignored("timings_per_token", _BOTH, "llama.cpp", "timings in the response"),
    _ignored("return_progress", _BOTH, "llama.cpp", "progress events while the prompt is computed"),
    _ignored("sse_ping_interval", _BOTH, "llama.cpp", "keep-alive comments in a stream"),
    # ---- keys inside response_format (which go with which type: `guided_fields.py`) --------------------
    _mapped(
        "response_format.type",
        _BOTH,
        "OpenAI",
        "text, json_object, json_schema, regex, grammar, choice, structural_tag",
    ),
    _mapped(
        "response_format.json_schema", _BOTH, "OpenAI", "json_schema: {name, schema, strict, description}"
    ),
    _mapped("response_format.schema", _BOTH, "llama.cpp", "json_object or json_schema: the schema itself"),
    _mapped("response_format.regex", _BOTH, "specexec", "regex: the pattern"),
    _mapped("response_format.grammar", _BOTH, "specexec", "grammar: the EBNF / GBNF text"),
    _mapped("response_format.choice", _BOTH, "specexec", "choice: the strings"),
    _mapped("response_format.format", _BOTH, "SGLang", "structural_tag: xgrammar's format object"),
    _mapped("response_format.structures", _BOTH, "SGLang", "structural_tag (legacy): begin, schema, end"),
    _mapped("response_format.triggers", _BOTH, "SGLang", "structural_tag (legacy): the triggers"),
    _default("response_format.at_least_one", _BOTH, "SGLang", (False,), "a structure forced at least once"),
    _ignored("response_format.json_schema.name", _BOTH, "OpenAI", "a label for the schema"),
    _mapped("response_format.json_schema.schema", _BOTH, "OpenAI", _GUIDED.format("a JSON schema")),
    _ignored("response_format.json_schema.strict", _BOTH, "OpenAI", "the schema is enforced either way"),
    _ignored(
        "response_format.json_schema.description",
        _BOTH,
        "OpenAI",
        "prose about the format: the schema itself is enforced token by token (vLLM and SGLang drop it too)",
    ),
)


def markdown_table() -> str:
    """`FIELDS` as the Markdown table docs/serving.md prints (a test keeps the two the same)."""
    lines = ["| field | on | from | action | what |", "|---|---|---|---|---|"]
    for f in FIELDS:
        action = f.action.value
        if f.action is Action.DEFAULT_ONLY:
            shown = ", ".join(f"`{json.dumps(a)}`" for a in f.accepted + (None,))
            action = f"default-only ({shown})"
        elif f.is_checked:
            action = "ignored (checked)"
        note = f.note.replace("|", "\\|")
        lines.append(f"| `{f.name}` | {', '.join(f.endpoints)} | {f.origin} | {action} | {note} |")
    return "\n".join(lines)
