"""An episode played by a real actor in-process (the tiny tokenizer), answered with scripted responses: what the
method tests record episodes with, exactly as the actors record them."""

import pathlib

import numpy as np

from explore_jax.actors.actor import Actor, ActorConfig, PromptTokenizer
from explore_jax.actors.protocol import EpisodeResult, Response

TINY = str(pathlib.Path(__file__).parents[2] / "explore_jax/hf/assets/tiny")
IM_END = 3  # the tiny tokenizer's end of turn


def play(hook, spec, responses, prompts=None) -> EpisodeResult:
  """The finished episode of `spec` under prompt `hook`, step t answered with `responses[t]`; each prompt the actor
  asked with is appended, decoded, to `prompts` when given."""
  tokenizer = PromptTokenizer.from_dir(TINY, max_prompt_tokens=10_000)
  sent = []
  actor = Actor(ActorConfig(actor_id=0, tokenizer_dir=TINY, prompt_hook=hook, envs_per_actor=1,
                            max_prompt_tokens=10_000), tokenizer, sent.append)
  actor.handle(spec)
  while True:
    message = sent.pop(0)
    if isinstance(message, EpisodeResult):
      return message
    if prompts is not None:
      prompts.append(tokenizer.decode(message.prompt_ids))
    ids = tokenizer.tokenizer(responses[message.step], add_special_tokens=False)["input_ids"] + [IM_END]
    n = len(ids)
    actor.handle(Response(message.episode_id, message.step, np.asarray(ids, np.int32), np.zeros(n, np.float32),
                          np.ones(n, np.float32), np.zeros(n, np.int32), 0))
