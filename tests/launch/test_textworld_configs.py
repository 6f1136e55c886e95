"""configs/{grpo,gigpo}_<world>.py: every text world's config builds at both scales, its environments start with
the config's kwargs and fit its prompt budget, and launch/train.py runs the tiny scale end to end."""

import json
import os
import subprocess
import sys

import gymnasium
import pytest

import explore_jax.envs  # noqa: F401  (registers the ids)
from configs import textworlds
from explore_jax.actors.actor import PromptTokenizer
from explore_jax.methods.base import ObservationPrompt

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER = os.path.join(REPO, "explore_jax", "hf", "assets", "tiny")
CONFIGS = [f"{method}_{world}" for world in textworlds.WORLDS for method in ("grpo", "gigpo")]
CONFIGS += ["empo2_twx", "empo2_scienceworld"]  # EMPO2's worlds (configs/textworlds.py builds it on any)


def _load(name, variant=""):
  import importlib
  return importlib.import_module(f"configs.{name}").get_config(variant)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_builds_at_both_scales(name):
  method, world = name.split("_", 1)
  for variant in ("", "paper"):
    c = _load(name, variant)
    assert c.method == method and c.env.id == textworlds.WORLDS[world]["id"]
    assert c.rl.advantage == ("gigpo" if method == "gigpo" else "grpo")
    assert c.env.kwargs.max_steps == c.env.max_steps  # the records' step bound is the episode's
  paper = _load(name, "paper")
  # EMPO2's ScienceWorld recipe has no KL term (its appendix C); GiGPO's recipe has 0.01.
  kl = 0.0 if method == "empo2" else 0.01
  assert paper.model.checkpoint is None and paper.rollout.group_size == 8 and paper.rl.loss.kl_coef == kl
  assert paper.env.max_steps == (30 if world == "scienceworld" else 50) and paper.history_steps == 2


def test_unknown_world_method_and_variant_are_named():
  with pytest.raises(ValueError, match="unknown text world 'webshop'"):
    textworlds.get_config("gigpo", "webshop")
  with pytest.raises(ValueError, match="unknown text-world method 'ppo'"):
    textworlds.get_config("ppo", "twx")
  with pytest.raises(ValueError, match="unknown variant 'huge'"):
    textworlds.get_config("grpo", "twx", "huge")


@pytest.mark.parametrize("world", list(textworlds.WORLDS))
def test_environments_start_with_the_config_and_prompts_fit(world):
  """Training, held-out (eval.more_splits' too) and SFT games start from the config's kwargs, and their first
  prompts (system prompt and observation, in the tiny tokenizer) fit rollout.max_prompt_tokens untruncated."""
  c = textworlds.get_config("gigpo", world)
  tokenizer = PromptTokenizer.from_dir(TOKENIZER, c.rollout.max_prompt_tokens)
  prompt = ObservationPrompt(system=c.system_prompt)
  settings = {"train": (dict(c.env.kwargs), 0), "held-out": ({**c.env.kwargs, **c.eval.env_kwargs}, 0),
              "sft": ({**c.env.kwargs, **c.sft.env_kwargs}, c.sft.oracle_seed_offset),
              **{split: ({**c.env.kwargs, **c.eval.env_kwargs, "split": split}, 0) for split in c.eval.more_splits}}
  for where, (kwargs, seed) in settings.items():
    env = gymnasium.make(c.env.id, **kwargs)
    try:
      observation, info = env.reset(seed=seed)
      _, cut = tokenizer.encode(prompt(observation, [], {}, info))
      assert cut == 0, f"{world} {where} seed {seed}: the first prompt loses {cut} tokens"
    finally:
      env.close()


@pytest.mark.parametrize("world", list(textworlds.WORLDS))
def test_sft_demonstrations_fit_the_token_budgets(world):
  """Every step of the SFT warm start's gold paths (the config's own request, its first 64 episodes at most: an
  ALFWorld game is generated on first use, ~5 s each) fits the rollout budgets untruncated: the prompt in
  max_prompt_tokens, the action and EOS in max_new_tokens (the SFT step refuses longer ones)."""
  from explore_jax import hf
  from explore_jax.train import warm_start
  c = textworlds.get_config("gigpo", world)
  c.sft.oracle_episodes = min(c.sft.oracle_episodes, 64)
  tokenizer = hf.load_tokenizer(TOKENIZER)
  request = warm_start.request(c, ObservationPrompt(system=c.system_prompt))
  encoder = PromptTokenizer(tokenizer, c.rollout.max_prompt_tokens)
  assert len(request.demonstrations) >= c.sft.oracle_episodes
  for d in request.demonstrations:
    _, cut = encoder.encode(d["messages"])
    assert cut == 0, f"{world}: a prompt before {d['response']!r} loses {cut} tokens"
    response = tokenizer(d["response"], add_special_tokens=False)["input_ids"]
    assert len(response) + 1 <= c.rollout.max_new_tokens, f"{world}: {d['response']!r} is {len(response)} tokens"


@pytest.mark.slow
@pytest.mark.parametrize("world", ["twx"])
def test_the_tiny_scale_trains_end_to_end(tmp_path, world):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  run = subprocess.run(
      [sys.executable, os.path.join(REPO, "launch", "train.py"), f"--config=configs/gigpo_{world}.py",
       f"--workdir={tmp_path}", "--config.train.num_iterations=1", "--config.sft.steps=2",
       "--config.sft.oracle_episodes=4", "--config.rollout.task_pool=2", "--config.rollout.num_tasks=2",
       "--config.rollout.group_size=2", "--config.eval.every=1", "--config.eval.num_episodes=2",
       # The pass@k before and after RL on 2 samples of 2 held-out games (the config's 4 x 32, twice, is 272
       # episodes), 4 live episodes per actor: the run's every part, on a test's budget.
       "--config.eval.passk_samples=2", "--config.eval.passk_held_out_tasks=2", "--config.rollout.envs_per_actor=4"],
      capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
  assert run.returncode == 0, run.stderr[-3000:]
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert rows[-1]["iteration"] == 1 and "eval/success_rate" in rows[-1] and "success_rate" in rows[-1]
  summary = json.load(open(tmp_path / "summary.json"))
  assert list(summary) == ["warm start / train", "trained / train", "warm start / held-out", "trained / held-out"]
