"""ScreenExplorer as wired into the loop, on hand-made screens: the record fields a step's screens give, the eight
terms against rl/screen_rewards.py (gate and term readings, eq. 1's total), the world model's batches and what its
kept predictions do to the reward, r_seq per trajectory whatever the record order, the diversity it logs, and the
distillation stream's choice of steps."""

import types

import numpy as np
import pytest

from configs import screen_explorer_miniwob
from explore_jax.methods import make_method, screen_explorer
from explore_jax.methods.base import BuildContext
from explore_jax.rl import screen_rewards as sr
from explore_jax.rl import world_model
from explore_jax.train import sft_data

E, D = 8, 384


def encoder(texts):
  """A deterministic unit vector per text (a stand-in for MiniLM)."""
  rows = [np.random.default_rng(abs(hash(t)) % 2**32).normal(size=E) for t in texts]
  return np.asarray([r / np.linalg.norm(r) for r in rows], np.float32)


def method(workdir="", **fields):
  c = screen_explorer_miniwob.get_config()
  for key, value in fields.items():
    target, *path = key.split("__")
    node = c.screen_explorer
    for p in [target, *path][:-1]:
      node = node[p]
    node[[target, *path][-1]] = value
  m = make_method(c)
  m.setup(BuildContext(model_config=None, encode=encoder, embedding_dim=E, workdir=workdir))
  return m


def screen(seed, boxes=()):
  return {"latent": np.random.default_rng(seed).normal(size=D).astype(np.float32), "boxes": [list(b) for b in boxes]}


A = screen(1, [[0, 0, 9, 9, "File"], [20, 0, 29, 9, "Edit"]])
B = screen(2, [[0, 0, 9, 9, "File"], [0, 20, 50, 29, "Untitled document"]])
C = screen(3, [])


def step(before, after, action, intent="", fmt=1.0, response="", observation=None):
  info = {"screen": {"before": before, "after": after}, "action": action, "intent": intent}
  return types.SimpleNamespace(info=info, format_reward=fmt, response_text=response or action,
                               observation=observation or {"screenshot": np.zeros((4, 4, 3), np.uint8), "text": "t"})


def episode(traj, steps):
  return types.SimpleNamespace(spec=types.SimpleNamespace(traj_id=traj), steps=steps)


def records(m, episodes, order=None):
  """Records of the episodes' steps as the loop packs them (extras from step_fields), rows in `order`."""
  rows = [(e.spec.traj_id, t, s, f) for e in episodes for t, (s, f) in enumerate(zip(e.steps, m.step_fields(e)))]
  order = range(len(rows)) if order is None else order
  rows = [rows[i] for i in order]
  extras = {k: np.stack([np.asarray(r[3][k]) for r in rows]) for k in rows[0][3]}
  return types.SimpleNamespace(extras=extras, valid=np.ones(len(rows), bool),
                               format_reward=np.array([r[2].format_reward for r in rows], np.float32),
                               task_reward=np.zeros(len(rows), np.float32),
                               traj_id=np.array([r[0] for r in rows]), step_index=np.array([r[1] for r in rows]))


EPISODES = [episode(0, [step(A, B, "Click(5, 5)", "Open the File menu"), step(B, B, None, fmt=0.0),
                        step(B, C, "Key(\"Ctrl+N\")", "Make a new document")]),
            episode(1, [step(A, A, "Move(3, 3)", "Hover over the menu bar"),
                        step(A, C, "DoubleClick(25, 5)", "Edit the text")])]


def test_step_fields_embed_both_screens_the_intent_and_the_text_under_a_click():
  m = method()
  fields = m.step_fields(EPISODES[0])
  click, invalid = fields[0], fields[1]
  np.testing.assert_array_equal(click["se_before_latent"], A["latent"])
  np.testing.assert_array_equal(click["se_after_latent"], B["latent"])
  np.testing.assert_allclose(click["se_before_text"], encoder(["Screen OCR: File Edit"])[0])
  np.testing.assert_allclose(click["se_box"], encoder(["Screen OCR: File"])[0])
  np.testing.assert_allclose(click["se_intent"], encoder(["Open the File menu"])[0])
  assert click["se_hit"] and not invalid["se_hit"] and not fields[2]["se_hit"]  # a Key hits nothing
  assert not invalid["se_intent"].any() and not invalid["se_box"].any()         # zero rows: similarity 0
  np.testing.assert_array_equal(click["se_actions"], world_model.action_bytes(["Click(5, 5)"], 64)[0][0])
  assert not invalid["se_actions"].any()


def test_a_step_without_its_screens_says_which_wrapper_it_needs():
  m = method()
  with pytest.raises(ValueError, match="ScreenReading-v0"):
    m.step_fields(episode(0, [types.SimpleNamespace(info={"action": "Click(1, 1)"})]))


def test_the_terms_are_the_reference_functions_gated_by_the_format():
  m = method()
  r = records(m, EPISODES)
  x, fmt = r.extras, r.format_reward > 0
  out = m.intrinsic_rewards(r, {}, {})
  assert set(out) == {f"se_{t}" for t in screen_explorer.TERMS}
  np.testing.assert_allclose(out["se_inst_vis"], sr.instant_change(x["se_before_latent"], x["se_after_latent"]) * fmt,
                             rtol=1e-5)
  np.testing.assert_allclose(out["se_des"], sr.intent_alignment(x["se_intent"], x["se_before_text"],
                                                                x["se_after_text"]) * fmt, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out["se_inter"], sr.intent_box(x["se_intent"], x["se_box"], x["se_hit"]) * fmt,
                             rtol=1e-5, atol=1e-6)
  assert out["se_inst_vis"][3] == 0.0 and out["se_inst_text"][3] == pytest.approx(0.0, abs=1e-6)  # unchanged
  assert (out["se_inter"] != 0).tolist() == [True, False, False, False, True]    # the clicks that hit text
  assert all(v[1] == 0.0 for v in out.values())                                  # the malformed step
  # Without kept predictions the world-model terms have nothing to compare: 0, not 1 - sim(x, 0).
  assert not out["se_world_vis"].any() and not out["se_world_text"].any()
  # Their sum is eq. 1's r_format x sum of the ungated terms (the "term" reading's, without its r_format).
  ungated = {k: v for k, v in method(format="term").intrinsic_rewards(r, {}, {}).items() if k != "se_format"}
  np.testing.assert_allclose(sum(out.values()), sr.total(ungated, fmt, gate=True), rtol=1e-5)


def test_the_term_reading_adds_the_format_beside_ungated_terms():
  gate, term = method(), method(format="term")
  r = records(gate, EPISODES)
  g, t = gate.intrinsic_rewards(r, {}, {}), term.intrinsic_rewards(r, {}, {})
  assert set(t) == set(g) | {"se_format"}
  np.testing.assert_array_equal(t["se_format"], [1, 0, 1, 1, 1])
  terms = {k: v for k, v in t.items() if k != "se_format"}
  np.testing.assert_allclose(sum(t.values()), sr.total(terms, r.format_reward > 0, gate=False), rtol=1e-5)
  # The malformed step keeps its sequence term in this reading; its intent terms are 0 (no intent).
  assert t["se_seq_vis"][1] > 0 and t["se_des"][1] == 0.0


def test_kept_predictions_drive_the_world_terms_and_a_perfect_one_gives_zero():
  m = method()
  r = records(m, EPISODES)
  n = len(r.valid)
  after_latent, after_text = r.extras["se_after_latent"], r.extras["se_after_text"]
  # As train/aux_models.last_outputs keeps them: rows up to the last record the world model saw (row 3 of 5).
  kept = {"seen": np.array([True, False, True, True]), "latent": after_latent[:4].copy(),
          "text": np.zeros_like(after_text[:4])}
  kept["latent"][2] = -after_latent[2]  # the opposite screen: surprise 2
  out = m.intrinsic_rewards(r, {}, {"world_model": kept})
  np.testing.assert_allclose(out["se_world_vis"], [0.0, 0.0, 2.0, 0.0, 0.0], atol=1e-5)
  np.testing.assert_allclose(out["se_world_text"], [1.0, 0.0, 1.0, 1.0, 0.0], atol=1e-6)  # zero predictions
  assert n == 5


def test_the_sequence_term_follows_each_trajectory_in_step_order_whatever_the_record_order():
  for form in ("paper", "code"):
    m = method(sequence_form=form)
    ordered = m.intrinsic_rewards(records(m, EPISODES), {}, {})["se_seq_vis"]
    shuffled = m.intrinsic_rewards(records(m, EPISODES, order=[4, 2, 0, 3, 1]), {}, {})["se_seq_vis"]
    np.testing.assert_allclose(shuffled, ordered[[4, 2, 0, 3, 1]], rtol=1e-6)
    # Trajectory 0 by hand: after-states [B, B, C], the middle one malformed.
    after = np.stack([B["latent"], B["latent"], C["latent"]])[None]
    mask = np.array([[True, form == "paper", True]])
    expected = np.asarray(sr.sequence_change(A["latent"][None], after, mask, form))[0] * [1, 0, 1]
    np.testing.assert_allclose(ordered[:3], expected, rtol=1e-5, atol=1e-6)


def test_world_model_batches_pass_over_the_well_formed_steps_once_per_epoch():
  m = method(world_model__epochs=3, world_model__batch_size=2)
  r = records(m, EPISODES)
  batches = m._batches(r)
  assert len(batches) == 3 * 2  # 4 well-formed steps in batches of 2, three epochs
  for epoch in range(3):
    rows = np.concatenate([b["row"] for b in batches[2 * epoch:2 * epoch + 2]])
    assert sorted(rows.tolist()) == [0, 2, 3, 4]
  b = batches[0]
  np.testing.assert_array_equal(b["next_latent"], r.extras["se_after_latent"][b["row"]])
  assert b["mask"].all()


def test_diversity_is_logged_over_the_iterations_after_states():
  m = method()
  out = m.observe(EPISODES, training=True)
  after = np.zeros((2, 3, D), np.float32)
  after[0] = [B["latent"], B["latent"], C["latent"]]
  after[1, :2] = [A["latent"], C["latent"]]
  mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
  assert out["diversity/d_seq_vis"] == pytest.approx(float(np.mean(sr.sequence_diversity(after, mask))), rel=1e-5)
  assert out["diversity/d_grp_vis"] == pytest.approx(
      float(sr.group_diversity(after.reshape(1, 6, D), mask.reshape(1, 6))[0]), rel=1e-5)
  assert m.observe(EPISODES, training=False) == {}


def test_distillation_keeps_well_formed_steps_with_positive_advantage_and_a_clear_intent(tmp_path):
  m = method(workdir=str(tmp_path), distill__from_iteration=3)
  r = records(m, EPISODES)
  m.observe(EPISODES, training=True)
  adv = np.array([0.5, 0.9, -0.1, 0.7, 0.2])
  assert m.observe_update(2, r, adv, r.valid) == {}  # before from_iteration
  out = m.observe_update(3, r, adv, r.valid)
  # Row 0 (clear intent, A > 0), row 1 malformed, row 2 A < 0, row 3 kept, row 4 "Edit the text" kept.
  assert out == {"distill/steps_kept": 3.0}
  demos = sft_data.load_demonstrations(str(tmp_path / "distill"))
  assert [d["response"] for d in demos] == ["Click(5, 5)", "Move(3, 3)", "DoubleClick(25, 5)"]
  assert all(len(d["images"]) == 1 and d["messages"][0]["content"] == screen_explorer.SYSTEM_PROMPT for d in demos)


def test_clear_intent_and_config_errors():
  assert screen_explorer.clear_intent("Open the File menu")
  assert not screen_explorer.clear_intent("Click it")
  assert not screen_explorer.clear_intent("Click(5, 5) on the button")
  assert not screen_explorer.clear_intent("")
  with pytest.raises(ValueError, match="unknown term.*'wrold_vis'"):
    c = screen_explorer_miniwob.get_config()
    c.screen_explorer.terms.wrold_vis = True
    make_method(c)
  c = screen_explorer_miniwob.get_config()
  c.env.screen_reading = {}
  with pytest.raises(ValueError, match="env.screen_reading"):
    make_method(c)


def test_the_desktop_config_warm_starts_on_json_replies_over_its_own_screenshots():
  from configs import screen_explorer_desktop
  from explore_jax.envs.screen_actions import parse_response
  from explore_jax.train import rollout

  c = screen_explorer_desktop.get_config()
  env_id, kwargs = rollout.environment(c, {**c.env.kwargs, "max_steps": 2}, demonstrations=True)
  assert env_id == "explore_jax/ScreenReading-v0" and kwargs["env"] == "explore_jax/Desktop-v0"
  demos = sft_data.oracle_sft_demos(env_id, kwargs, [0], make_method(c).prompt_hook())
  assert len(demos) == 2
  for d in demos:
    (image,) = d["images"]
    assert image.shape == tuple(c.rollout.image_shape)
    action, error = parse_response(d["response"], 320, 240)
    assert action is not None and action.kind == "DoubleClick", error
    assert screen_explorer.clear_intent(action.intent)
    assert d["messages"][0]["content"] == screen_explorer.SYSTEM_PROMPT


def test_snapshots_keep_the_first_episodes_screens_and_replies(tmp_path):
  import json

  m = method(workdir=str(tmp_path), snapshots_every=5)
  r = records(m, EPISODES)
  m.observe(EPISODES, training=True)
  m.observe_update(3, r, np.zeros(5), r.valid)
  assert not (tmp_path / "screens").exists()
  m.observe_update(5, r, np.zeros(5), r.valid)
  folder = tmp_path / "screens" / "iter_000005"
  assert sorted(p.name for p in folder.iterdir()) == ["step_0.png", "step_1.png", "step_2.png", "steps.json"]
  steps = json.load(open(folder / "steps.json"))["steps"]
  assert [s["format_ok"] for s in steps] == [True, False, True] and steps[0]["intent"] == "Open the File menu"
