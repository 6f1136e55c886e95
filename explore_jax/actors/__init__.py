"""Actor processes: they step environments, build and tokenise prompts, and stream finished records.

  ActorPool   the learner's side: hands out episodes, batches prompts for one policy call, replaces actors
  Actor       one actor's event loop (run in a spawned process by actor_main; no jax there)
  protocol    the messages between them
"""

from explore_jax.actors.actor import Actor, ActorConfig, EnvCache, PromptTokenizer, actor_main
from explore_jax.actors.pool import ActorPool, EmbedFn, PolicyFn
from explore_jax.actors.protocol import (STOP, ActorFailure, ActorHello, CancelEpisodes, EmbedRequest,
                                         Embeddings, EpisodeResult, EpisodesCancelled, EpisodeSpec, Prompt,
                                         PromptHook, PromptRequest, Response, StepRecord)

__all__ = ["Actor", "ActorConfig", "ActorFailure", "ActorHello", "ActorPool", "CancelEpisodes", "EmbedFn",
           "EmbedRequest", "Embeddings", "EnvCache", "EpisodeResult", "EpisodeSpec", "EpisodesCancelled",
           "PolicyFn", "Prompt", "PromptHook", "PromptRequest", "PromptTokenizer", "Response", "STOP",
           "StepRecord", "actor_main"]
