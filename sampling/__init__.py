"""Token sampling: per-request parameters, logit filters and the batch sampler."""

from .host_values import device_tensor
from .logits import apply_sampling_filters, compute_probs
from .params import SamplingParams
from .sampler import Sampler, sample_from_probs

__all__ = [
    "SamplingParams",
    "Sampler",
    "apply_sampling_filters",
    "compute_probs",
    "device_tensor",
    "sample_from_probs",
]
