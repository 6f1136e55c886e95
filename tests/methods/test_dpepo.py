"""DPEPO (methods/dpepo.py): the parallel prompt's layout, W_t from an episode an actor recorded to the advantages
(by hand), the weight's ablation forms, its composition with SGE, and the configs."""

import jax.numpy as jnp
import numpy as np
import pytest

from configs import dpepo_keydoor
from explore_jax.actors.actor import PromptTokenizer
from explore_jax.actors.protocol import EpisodeSpec
from explore_jax.envs import ParallelCopies
from explore_jax.hf import TINY_ASSETS
from explore_jax.methods import make_method
from explore_jax.methods.base import STEP_WEIGHT_FIELD, ObservationPrompt
from explore_jax.methods.dpepo import RESPONSE_FORMAT, ParallelPrompt
from explore_jax.rl.advantages import StepRecords, get_advantage_estimator
from explore_jax.train import rollout
from tests.methods.scripted import play


def parallel(*actions):
  return "<parallel>" + "".join(f"<env_{i}>{a}</env_{i}>" for i, a in actions) + "</parallel>"


def config(**dpepo):
  c = dpepo_keydoor.get_config()
  for k, v in dpepo.items():
    setattr(c.dpepo, k, v)
  return c


# ---- the prompt ----------------------------------------------------------------------------------------------

def test_the_layout_groups_earlier_steps_per_copy_then_shows_where_each_copy_is():
  env = ParallelCopies("explore_jax/KeyDoor-v0", num_copies=2, env_kwargs={"num_rooms": 4})
  start, info = env.reset(seed=3)
  room = env.copies[0].raw_observation()
  hook = ParallelPrompt(inner=ObservationPrompt(system="Act.", instruction="Go."))
  first = hook(start, [], {}, info).messages
  assert first[0] == {"role": "system", "content": "Act."}
  assert first[1]["content"] == "\n".join([
      f"Your task and where you start:\n{room}", "Where each environment is now:",
      f"In Environment 1:\nNo action taken yet.\nObservation: {room}",
      f"In Environment 2:\nNo action taken yet.\nObservation: {room}",
      f"You can explore up to 2 different environments, ranging from 1 to 2. {RESPONSE_FORMAT}", "Go."])
  _, _, _, _, info = env.step(parallel((1, "go left"), (2, "go right")))
  after_left, after_right = info["copy_observations"][0][0], info["copy_observations"][1][0]
  _, _, _, _, info = env.step(parallel((1, "go left")))
  text = hook(None, [], {}, info).messages[1]["content"]
  now_left = env.copies[0].raw_observation()
  assert text.split("\n", 1)[0] == "Your task and where you start:"
  assert "\n".join(["Your earlier steps:", "In Environment 1:", "Action 1: go left",
                    f"Observation 1: {after_left}", "Where each environment is now:",
                    f"In Environment 1:\nYour last action: go left\nObservation: {now_left}",
                    f"In Environment 2:\nYour last action: go right\nObservation: {after_right}"]) in text
  # history_steps = 0: earlier steps keep their action only (what a long prompt gives up first).
  short = ParallelPrompt(inner=ObservationPrompt(system=""), history_steps=0)(None, [], {}, info).messages[0]["content"]
  assert "Action 1: go left\nWhere each environment is now:" in short and "Observation 1:" not in short


def test_the_layout_lists_admissible_actions_a_copy_does_not_show_and_marks_ended_copies():
  info = {"initial_observation": "start", "histories": [["a"], []], "copy_observations": [["seen a"], []],
          "copy_admissible_actions": [["x", "y"], ["z"]], "copy_ended": [True, False]}
  text = ParallelPrompt(inner=ObservationPrompt(system=""))(None, [], {}, info).messages[0]["content"]
  assert "In Environment 1:\nYour last action: a\nObservation: seen a\nThis environment's episode has ended." in text
  assert "In Environment 2:\nNo action taken yet.\nObservation: start\nAdmissible actions: z." in text


def test_past_the_budget_the_prompt_gives_up_old_observations_then_old_actions_and_keeps_the_task():
  histories = [["a1", "a2", "a3"], ["b1", "b2", "b3"]]
  info = {"initial_observation": "start", "histories": histories,
          "copy_observations": [["sa1", "sa2", "sa3"], ["sb1", "sb2", "sb3"]]}
  prompt = ParallelPrompt(inner=ObservationPrompt(system="Act."))(None, [], {}, info)
  forms = [prompt.messages, *prompt.shorter]
  texts = [m[1]["content"] for m in forms]
  assert all(m[0] == {"role": "system", "content": "Act."} for m in forms)
  assert all(t.startswith("Your task and where you start:\nstart\n") and t.endswith(RESPONSE_FORMAT) for t in texts)
  assert all("In Environment 2:\nYour last action: b3\nObservation: sb3" in t for t in texts)
  # Observations of earlier steps go first, oldest first (2 steps shown, then 1, then none) ...
  assert [sum(f"Observation {n}: sa{n}" in t for n in (1, 2)) for t in texts[:3]] == [2, 1, 0]
  assert "Observation 2: sa2" in texts[1] and "Observation 1:" not in texts[1]
  # ... then the earlier actions, oldest first; the last form lists none of them.
  assert "Action 1: a1" in texts[2] and "In Environment 1:\nAction 2: a2\nIn Environment 2:\nAction 2: b2" in texts[3]
  assert "Action 1:" not in texts[3] and "Your earlier steps:" not in texts[4] and len(texts) == 5
  assert [len(t) for t in texts] == sorted((len(t) for t in texts), reverse=True)
  # history_steps bounds the observations from the start: the forms begin at one shown observation.
  one = ParallelPrompt(inner=ObservationPrompt(system=""), history_steps=1)(None, [], {}, info)
  assert len([one.messages, *one.shorter]) == 4


def test_the_actor_samples_the_first_form_that_fits_the_budget():
  tokenizer = PromptTokenizer.from_dir(TINY_ASSETS, max_prompt_tokens=10_000)
  info = {"initial_observation": "start", "histories": [["go left"] * 6], "copy_observations": [["a room"] * 6]}
  prompt = ParallelPrompt(inner=ObservationPrompt(system="Act."))(None, [], {}, info)
  forms = [prompt.messages, *prompt.shorter]
  lengths = [len(tokenizer.encode(m)[0]) for m in forms]
  budget = (lengths[3] + lengths[2]) // 2  # the fourth form fits, the third does not
  fitting = PromptTokenizer(tokenizer.tokenizer, budget)
  prompt = ParallelPrompt(inner=ObservationPrompt(system="Act."))(None, [], {}, info)
  ids, cut, form = fitting.encode_fitting([prompt.messages, *prompt.shorter])
  assert (ids, cut, form) == (tokenizer.encode(forms[3])[0], 0, 3)
  # When no form fits, the last (shortest) is cut from the left, as any long prompt is.
  tight = PromptTokenizer(tokenizer.tokenizer, lengths[-1] - 5)
  ids, cut, form = tight.encode_fitting(forms)
  assert (ids, cut, form) == (tokenizer.encode(forms[-1])[0][5:], 5, len(forms) - 1)


def test_outside_parallel_copies_the_prompt_says_what_to_set():
  with pytest.raises(ValueError, match="env.parallel.copies"):
    ParallelPrompt()("a room", [], {}, {"state_key": 1})


# ---- W_t from what an actor recorded, to the advantages --------------------------------------------------------

def _two_copies(max_steps):
  """DPEPO in 2 copies of a 3-room KeyDoor: the method, and a spec maker for episode i of group 0 (seed 5)."""
  c = config()
  c.env.parallel.copies = 2
  env_id, kwargs = rollout.environment(c, {"num_rooms": 3, "max_steps": max_steps})
  return make_method(c), lambda i: EpisodeSpec(episode_id=i, group_id=0, traj_id=i, env_id=env_id, env_kwargs=kwargs,
                                               seed=5)


def test_step_weights_of_a_recorded_episode_and_its_advantages_by_hand():
  method, spec_of = _two_copies(max_steps=4)
  spec = spec_of(0)
  failed = play(method.prompt_hook(), spec, [
      parallel((1, "go left"), (2, "go left")),   # c_wid = 1, no history: W = (0.95 + 1) / 2
      parallel((1, "go left"), (2, "go right")),  # copy 1 repeats (c_dep 1): W_1 = (0.8 + 1 + 1) / 3, W_2 = 1
      "I am not sure",                             # no action: 0.5
      parallel((1, "go left"))])                   # c_dep 2, c_dtr 1: W_1 = (0.64 + 0.95 + 1) / 3
  assert [len(s.info["parsed_actions"]) for s in failed.steps] == [2, 2, 0, 1]
  weights = [f[STEP_WEIGHT_FIELD] for f in method.step_fields(failed)]
  w1 = (0.8 + 1 + 1) / 3
  expected_w = [(0.95 + 1) / 2, (1 + (w1 + 1) / 2) / 2, 0.5, (1 + (0.64 + 0.95 + 1) / 3) / 2]
  np.testing.assert_allclose(weights, expected_w, rtol=1e-12)

  # A winning episode of the same group: the oracle in both copies.
  won_spec = spec_of(1)
  mirror = ParallelCopies("explore_jax/KeyDoor-v0", num_copies=2, env_kwargs={"num_rooms": 3, "max_steps": 4})
  mirror.reset(seed=5)
  script = []
  while not mirror._ended:
    script.append(mirror.oracle_action())
    mirror.step(script[-1])
  won = play(method.prompt_hook(), won_spec, script)
  assert won.success and not failed.success
  won_w = [f[STEP_WEIGHT_FIELD] for f in method.step_fields(won)]
  assert won_w[0] == pytest.approx((0.95 + 1) / 2)  # both copies take the oracle's first action

  # The dpepo estimator over the group's step records (the released code's statistics): A_traj = (R - mean) /
  # (std + 1e-6), R the trajectory's return on each of its records; A_t = A W_t (A >= 0), A (2 - W_t) (A < 0).
  steps = [(0, s) for s in failed.steps] + [(1, s) for s in won.steps]
  returns = {0: failed.total_reward, 1: won.total_reward}
  r = np.array([returns[t] for t, _ in steps])
  a = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
  w = np.array(weights + won_w)
  by_hand = np.where(a >= 0, a * w, a * (2 - w))
  records = StepRecords(rewards=jnp.asarray([s.task_reward for _, s in steps], jnp.float32),
                        group_ids=jnp.zeros(len(steps), jnp.int32), valid=jnp.ones(len(steps), bool),
                        traj_ids=jnp.asarray([t for t, _ in steps]), step_ids=jnp.asarray([s.step_index for _, s in steps]),
                        step_weights=jnp.asarray(w, jnp.float32))
  got = get_advantage_estimator(method.advantage_name)(records, **method.advantage_options())
  np.testing.assert_allclose(got, by_hand, rtol=1e-5)


@pytest.mark.parametrize("form, expected", [
    ("full", [(0.95 + 1) / 2, (1 + (0.8 + 2) / 3) / 2]),
    ("depth", [1.0, (0.8 + 2) / 3]),
    ("width", [0.95, 1.0]),
    ("off", [1.0, 1.0]),
    ("scripts", [1.0, 1.0])])
def test_each_weight_form_of_two_steps(form, expected):
  method = make_method(config(weight=form))
  steps = [{1: "go left", 2: "go left"}, {1: "go left"}]
  np.testing.assert_allclose(method.weights(steps), expected, rtol=1e-12)
  assert method.weights([{}]) == [1.0 if form in ("off", "scripts") else 0.5]


def test_the_released_rounding_and_width_exclusions_are_config_fields():
  steps = [{1: "look", 2: "look", 3: "go left"}]
  assert make_method(config(width_ignore="look")).weights(steps) == [1.0]
  three = [{1: "a", 2: "a", 3: "a"}]  # c_wid = 2: (0.95^2 + 1) / 2 = 0.95125
  assert make_method(config(round_to=2)).weights(three) == [0.95]
  assert make_method(config()).weights(three) == [pytest.approx(0.95125, abs=1e-15)]


def test_bad_dpepo_settings_name_the_field():
  with pytest.raises(ValueError, match="dpepo.weight must be one of"):
    make_method(config(weight="diverse"))
  c = config()
  c.env.parallel.copies = 0
  with pytest.raises(ValueError, match="env.parallel.copies"):
    make_method(c)


# ---- composition and configs ------------------------------------------------------------------------------------

def sge_config(c):
  """`c` with SGE's block (configs/coding.py's) and method "dpepo+sge"."""
  from configs import coding

  c.method = "dpepo+sge"
  c.sge = coding.get_config("sge").sge
  c.instruction = "State your strategy after ### Strategy, then act after ### Code."
  return c


def test_dpepo_with_sge_puts_the_strategy_prompt_inside_the_parallel_layout():
  from explore_jax.methods.sge import StrategyPrompt

  method = make_method(sge_config(config()))
  hook = method.prompt_hook()
  assert isinstance(hook, ParallelPrompt) and isinstance(hook.inner, StrategyPrompt)
  env = ParallelCopies("explore_jax/KeyDoor-v0", num_copies=4)
  _, info = env.reset(seed=0)
  content = hook(None, [], {}, info).messages[-1]["content"]
  assert content.startswith("Your task and where you start:")
  assert content.endswith("ranging from 1 to 4. " + RESPONSE_FORMAT + "\n" + method.config.instruction)
  assert method.temperatures() == [1.2, 0.7] and method.delimiters() == ["### Code"]  # SGE's schedule
  assert STEP_WEIGHT_FIELD in method.record_fields(None) and "good" in method.state_dict()["sge"]


@pytest.mark.parametrize("name, variant", [
    (name, variant) for name in ("dpepo_twx", "dpepo_alfworld", "dpepo_scienceworld") for variant in ("", "small", "paper")
] + [("dpepo_keydoor", ""), ("dpepo_keydoor", "small")])
def test_every_dpepo_config_builds_its_method_in_parallel_copies(name, variant):
  import importlib

  module = importlib.import_module(f"configs.{name}")
  c = module.get_config(variant)
  method = make_method(c)
  assert method.name == "dpepo" and c.env.parallel.copies == 4 and c.rl.advantage == "dpepo"
  env_id, kwargs = rollout.environment(c, dict(c.env.kwargs))
  assert env_id == "explore_jax/Parallel-v0" and kwargs["num_copies"] == 4 and kwargs["env"] == c.env.id
  if variant == "paper":
    assert (c.optimizer.learning_rate, c.rl.loss.kl_coef, c.rl.loss.entropy_coef, c.model.lora.rank) == (
        1e-6, 0.01, 0.001, 32)
    assert c.env.max_steps == 25 and c.rollout.group_size == (4 if name == "dpepo_scienceworld" else 8)


def test_the_diversity_measures_of_recorded_episodes():
  from explore_jax.methods.dpepo import diversity

  method, spec_of = _two_copies(max_steps=3)
  a = play(method.prompt_hook(), spec_of(0), [parallel((1, "go left"), (2, "go left")), "no action",
                                               parallel((1, "go right"), (2, "go left"))])
  b = play(method.prompt_hook(), spec_of(1), [parallel((2, "go left"))] * 3)
  d = diversity([a, b])
  assert d["copies_acting_per_step"] == pytest.approx((2 + 0 + 2 + 1 + 1 + 1) / 6)
  assert d["distinct_actions_per_step"] == pytest.approx((1 + 2 + 1 + 1 + 1) / 5)
  # Transitions (copy's state, action): a's first step takes "go left" twice from the start (one pair); its last
  # step two more; b's copy 2 walks "go left" from the start (shared with a), then from two further rooms.
  keys = {(s, act) for r in (a, b) for s, act in _transitions(r)}
  assert d["distinct_transitions_per_group"] == len(keys)
  assert d["steps_to_success"] == 0.0
  assert method.observe([a, b], training=True)["dpepo/distinct_transitions_per_group"] == len(keys)


def _transitions(result):
  """(state before, action) of each copy's action, by replaying the episode in a mirror of its world."""
  env = ParallelCopies("explore_jax/KeyDoor-v0", num_copies=2, env_kwargs={"num_rooms": 3, "max_steps": 3})
  env.reset(seed=5)
  out = []
  for s in result.steps:
    before = [copy.raw_observation() for copy in env.copies]
    env.step(s.response_text)
    out += [(before[i], a) for i, a in enumerate(env.actions) if a is not None]
  return out


def test_without_copies_a_run_plays_the_world_itself_and_keeps_its_warm_start_key():
  from configs import grpo_keydoor
  from explore_jax.rl import diversity
  from explore_jax.train.warm_start import warm_start_key

  c = grpo_keydoor.get_config()
  assert c.env.parallel.copies == 0
  assert rollout.environment(c, {"num_rooms": 3}) == ("explore_jax/KeyDoor-v0", {"num_rooms": 3})
  older = c.copy_and_resolve_references()
  del older.env["parallel"]  # a config from before parallel copies existed
  assert warm_start_key(c, "tiny", 112, 8) == warm_start_key(older, "tiny", 112, 8)
  c.env.parallel.copies = 2
  assert warm_start_key(c, "tiny", 112, 8) != warm_start_key(older, "tiny", 112, 8)
  with pytest.raises(ValueError, match="form must be one of"):
    diversity.dpepo_step_weight({}, {1: "a"}, form="breadth")
