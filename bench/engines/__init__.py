"""The engines a benchmark run compares, each turning prompts into `RequestRecord`s: specexec and
Hugging Face `generate` in this process (`specexec_hf`), llama.cpp through its Python binding
(`llamacpp`), and any OpenAI-compatible server (`server`)."""
