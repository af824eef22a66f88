"""Weight-only quantized linear layers: the ``quantization`` key (int8, int4, a GGUF's own codes), the
layers and their torch kernels, and specexec's integer-dot kernels (``quantized_kernel``)."""
