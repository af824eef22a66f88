#!/bin/bash
# A Llama model of Qwen2.5-0.5B's shape with random weights (hidden 896, 24 layers, 14 heads, 2 KV heads,
# MLP 4864, tied head; no q/k/v biases) and SmolLM2's tokenizer (its 49,152-token vocabulary: no Qwen
# tokenizer is on this machine, and with a Qwen2 architecture transformers reloads the SmolLM2 tokenizer
# wrong; speed does not depend on the values), written as an HF directory, converted with
# llama.cpp's convert_hf_to_gguf.py (llama-cpp-python 0.3.36's vendor/llama.cpp) and quantized to Q4_K_M
# with its llama-quantize. Run from the repository root; about 2 minutes, 2.5 GB in /opt/gguf.
set -eu
out=${OUT:-/opt/gguf}
src=${LLAMA_CPP_SRC:-/opt/llamacpp-src/llama_cpp_python-0.3.36/vendor/llama.cpp}
bin=${LLAMA_CPP_BIN:-/opt/llamacpp-build/bin}
python - "$out/random-llama-0.5b-hf" <<'PY'
import shutil, sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

tokenizer = Path("/opt/gguf/smollm2-135m-instruct-hf")
config = LlamaConfig(
    hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    intermediate_size=4864, vocab_size=49152, max_position_embeddings=8192, rope_theta=1_000_000.0,
    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16",
)
torch.manual_seed(0)
model = LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(sys.argv[1])
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    shutil.copy(tokenizer / name, Path(sys.argv[1]) / name)
PY
# The converter recognizes SmolLM's pre-tokenizer by a hash of its encodings, which this transformers (5.24)
# changes; the tokenizer is SmolLM2's, so it is named so where the hash is not found
python - "$src" "$out" <<'PY'
import runpy, sys

src, out = sys.argv[1:3]
sys.path.insert(0, src)
from conversion import base

known = base.TextModel.get_vocab_base_pre


def smollm_where_unknown(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "smollm"


base.TextModel.get_vocab_base_pre = smollm_where_unknown
sys.argv = ["convert_hf_to_gguf.py", f"{out}/random-llama-0.5b-hf", "--outtype", "f16",
            "--outfile", f"{out}/random-llama-0.5b-f16.gguf"]
runpy.run_path(f"{src}/convert_hf_to_gguf.py", run_name="__main__")
PY
"$bin/llama-quantize" "$out/random-llama-0.5b-f16.gguf" "$out/random-llama-0.5b-q4_k_m.gguf" Q4_K_M
