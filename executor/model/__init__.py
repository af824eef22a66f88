"""The model: loading (HF directories, GGUF, the embedded default), the model runner over a flat ragged
batch, paged attention and its metadata, the KV cache, CUDA graphs and their static shapes. Imports
`layers/` only, never the engine or the front."""
