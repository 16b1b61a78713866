"""Sampling on the device: SamplingMetadata (one step's parameters as tensors) and the Sampler."""

from folio.sample.metadata import SamplingMetadata, SamplingRow
from folio.sample.sampler import Sampler, SamplerOutput, gather_logprobs, make_request_generator

__all__ = [
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "SamplingRow",
    "gather_logprobs",
    "make_request_generator",
]
