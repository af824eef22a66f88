"""The ops a model is made of and how they run on this machine: dense, packed and quantized linear layers,
GGUF weights, attention kernels, and the measured choices of dtype and kernel (cached per CPU). The
executor's bottom floor: imports nothing of specexec's."""
