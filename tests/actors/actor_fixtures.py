"""What the actor tests need inside spawned actors: a KeyDoor that fails on demand, and prompt hooks.

Spawned processes import by module path, so these live in a module (not in a test file) that the child
imports as `tests.actors.actor_fixtures` (the repository root is on sys.path, and spawn passes it on).
No jax here: importing this module in an actor must keep it jax-free.
"""

import dataclasses
import os
import sys
import threading
import time

import gymnasium
import numpy as np

from explore_jax.actors.protocol import Prompt
from explore_jax.envs import KeyDoorEnv

FAULTY_ID = "explore_jax_tests/FaultyKeyDoor-v0"
# `module:id` makes gymnasium import this module (and so register the id) in whichever process makes it.
FAULTY_ENV = f"{__name__}:{FAULTY_ID}"

if FAULTY_ID not in gymnasium.registry:
  gymnasium.register(id=FAULTY_ID, entry_point=f"{__name__}:FaultyKeyDoor")
RECORDING_ENV = f"{__name__}:explore_jax_tests/RecordingKeyDoor-v0"
CONCURRENT_ENV = f"{__name__}:explore_jax_tests/ConcurrentKeyDoor-v0"


class FaultyKeyDoor(KeyDoorEnv):
  """KeyDoor failing where an episode's reset options say: raise_on_reset, raise_at_step, hang_at_step."""

  def reset(self, *, seed=None, options=None):
    options = dict(options or {})
    self.faults = {k: options.pop(k) for k in ("raise_at_step", "hang_at_step") if k in options}
    if options.pop("raise_on_reset", False):
      raise RuntimeError("injected fault on reset")
    return super().reset(seed=seed, options=options)

  def step(self, response):
    step = self.steps + 1
    if self.faults.get("raise_at_step") == step:
      raise RuntimeError(f"injected fault at step {step}")
    if self.faults.get("hang_at_step") == step:
      time.sleep(600)  # far past any timeout: the pool kills the actor long before
    return super().step(response)


class RecordingKeyDoor(FaultyKeyDoor):
  """Records the thread of each reset and step (`calls`, shared by the class); a step first waits at `barrier`
  when one is set, so that a test can ask for steps that run at once."""
  calls: list[tuple[str, int]] = []
  barrier = None

  def reset(self, *, seed=None, options=None):
    type(self).calls.append(("reset", threading.get_ident()))
    return super().reset(seed=seed, options=options)

  def step(self, response):
    type(self).calls.append(("step", threading.get_ident()))
    if type(self).barrier is not None:
      type(self).barrier.wait()
    return super().step(response)


class ConcurrentKeyDoor(RecordingKeyDoor):
  """A world whose instances may be stepped at once (actors/actor.py)."""
  metadata = {**KeyDoorEnv.metadata, "concurrent_instances": True}


for _cls in (RecordingKeyDoor, ConcurrentKeyDoor):
  if f"explore_jax_tests/{_cls.__name__}-v0" not in gymnasium.registry:
    gymnasium.register(id=f"explore_jax_tests/{_cls.__name__}-v0", entry_point=f"{__name__}:{_cls.__name__}")


def prompt(observation, history, context, info):
  """The user message: an optional preamble (long prompts), the observation, and whether jax is loaded."""
  content = f"{context.get('preamble', '')}{observation}\n[jax loaded: {'jax' in sys.modules}]"
  return [{"role": "user", "content": content}]


def log_start(history, context):
  """At an episode's first step, a line with its context's "episode" in <context["log_dir"]>/<actor pid>.txt:
  which process's actors played which episode."""
  if not history:
    with open(os.path.join(context["log_dir"], f"{os.getpid()}.txt"), "a") as f:
      f.write(f"{context['episode']}\n")


def logged_prompt(observation, history, context, info):
  """`prompt`, logged by log_start."""
  log_start(history, context)
  return prompt(observation, history, context, info)


def played(log_dir, pids):
  """The episodes that the actor processes `pids` started, as logged_prompt logged them."""
  episodes = []
  for pid in pids:
    path = os.path.join(log_dir, f"{pid}.txt")
    if os.path.exists(path):
      with open(path) as f:
        episodes += [int(line) for line in f]
  return sorted(episodes)


def failing_prompt(observation, history, context, info):
  """A prompt hook that fails on an episode's second step (when there is history)."""
  if history:
    raise KeyError("no such tip")
  return prompt(observation, history, context, info)


@dataclasses.dataclass(frozen=True)
class MethodPrompt:
  """A hook object with every optional part, each switched on by the episode's context (as a method's is):

    "tip": the prompt starts with it; the variant "no_tip" is the same prompt without it (EMPO2's pair), and its
           notes say one tip was shown at which step
    "embed": the learner embeds the observation; the prompt shows the vector's first value
    "final": once the episode is over, a final prompt asks for a tip
    "fail": "embedding_texts" or "final_prompt" raises
  Without any of them it prompts exactly as `prompt` does.
  """

  def __call__(self, observation, history, context, info):
    messages = prompt(observation, history, context, info)
    if "embeddings" in info:
      messages[0]["content"] += f"\n[embedding: {info['embeddings'][0, 0]:g}]"
    if "tip" not in context:
      return messages
    return Prompt([{"role": "user", "content": f"Tip: {context['tip']}\n{messages[0]['content']}"}],
                  {"no_tip": messages}, notes={"tips": 1, "step": len(history)})

  def embedding_texts(self, observation, history, context, info):
    if context.get("fail") == "embedding_texts":
      raise KeyError("no tip memory")
    return [observation] if context.get("embed") else []

  def final_prompt(self, observation, history, context, info):
    if context.get("fail") == "final_prompt":
      raise KeyError("no reflection template")
    if not context.get("final"):
      return None
    return [{"role": "user", "content": f"{observation}\nThe episode ended after {len(history)} steps. Write a tip."}]


@dataclasses.dataclass(frozen=True)
class LoggedMethodPrompt(MethodPrompt):
  """MethodPrompt, logged by log_start."""

  def __call__(self, observation, history, context, info):
    log_start(history, context)
    return super().__call__(observation, history, context, info)


# ---- the learner's side of the tests: a scripted policy and its replay --------------------------------

def mirror(spec):
  """A fault-free local copy of a spec's episode, reset like the actor resets it."""
  env = KeyDoorEnv(**spec.env_kwargs)
  options = {k: v for k, v in spec.reset_options.items() if k == "task_id"}
  observation, info = env.reset(seed=spec.seed, options=options)
  return env, observation, info


def scripted_action(env, episode_id, step):
  """The oracle's action, except a malformed one now and then (format reward 0)."""
  return "dance!" if (episode_id + step) % 4 == 3 else env.oracle_action()


def chat_text(observation, preamble="", jax_loaded=False, suffix=""):
  """The tiny tokenizer's chat template written out by hand for `prompt`'s single user message.

  `jax_loaded` is what the hook saw: False in actor processes; in-process tests pass their own
  process's state, which depends on what other tests ran before them.
  """
  return (f"<|im_start|>user\n{preamble}{observation}\n[jax loaded: {jax_loaded}]{suffix}<|im_end|>\n"
          f"<|im_start|>assistant\n")


def embed_text(text):
  """The stand-in encoder: a deterministic vector per text (its first value a whole number, printed exactly)."""
  return np.array([sum(map(ord, text)) % 1000, len(text), 0.5, -1.0], np.float32)


def embed(requests):
  """An embed_fn: one row per text of each EmbedRequest."""
  return [np.stack([embed_text(t) for t in r.texts]) for r in requests]


def final_tip(episode_id):
  """What the scripted policy answers to an episode's final prompt."""
  return f"Tip for episode {episode_id}: take the key first."


def method_texts(context, observation, jax_loaded=False):
  """(prompt text, {variant: text}) that MethodPrompt builds for an episode with `context`, by hand."""
  preamble = context.get("preamble", "")
  suffix = f"\n[embedding: {embed_text(observation)[0]:g}]" if context.get("embed") else ""
  plain = chat_text(observation, preamble, jax_loaded, suffix)
  if "tip" not in context:
    return plain, {}
  return chat_text(observation, f"Tip: {context['tip']}\n{preamble}", jax_loaded, suffix), {"no_tip": plain}
