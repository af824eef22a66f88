"""specexec's own decoder for the Llama family (Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3): a
transformers model's layers converted in place into fused ones (`convert.py`: one QKV and one gate/up
projection per layer), run by one forward of fixed ops over the paged cache (`forward.py`). Imports
`model/` (paged attention) and `layers/` only."""
