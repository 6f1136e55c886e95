"""Sampling: the jitted KV-cache sampler with per-segment temperatures, and the learner's logprobs."""

from explore_jax.sampling.sampler import (FinishReason, SampleOutput, TokenLogprobs, generate, generate_jit,
                                          left_pad, response_logprobs, sampling_log_probs, shard_params,
                                          token_logprobs)
from explore_jax.sampling.schedule import (SamplingParams, advance_segment, ends_with, make_sampling_params,
                                           pack_sequences, segment_ids, sge_sampling_params,
                                           temperature_per_token)

__all__ = [
    "FinishReason", "SampleOutput", "SamplingParams", "TokenLogprobs", "advance_segment", "ends_with",
    "generate", "generate_jit", "left_pad", "make_sampling_params", "pack_sequences", "response_logprobs",
    "sampling_log_probs", "segment_ids", "sge_sampling_params", "shard_params", "temperature_per_token",
    "token_logprobs",
]
