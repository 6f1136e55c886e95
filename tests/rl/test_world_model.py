"""ScreenExplorer's world model (rl/world_model.py) as an aux model: it learns a fixed transition, its
kept outputs are the last epoch's predictions, and its kernels name their logical axes."""

import functools

import jax
import numpy as np

from explore_jax.parallel import make_mesh, sharding
from explore_jax.rl import world_model as wm
from explore_jax.train.aux_models import AuxModel, AuxModelSpec, last_outputs

CONFIG = wm.WorldModelConfig(latent_dim=24, image_tokens=4, text_dim=8, action_len=12, hidden=32, layers=1,
                             heads=2, mlp=64)


def _transitions(n, seed=0):
  """A fixed transition: the next latent and text are fixed functions of (state, action kind)."""
  rng = np.random.default_rng(seed)
  latent = rng.normal(size=(n, CONFIG.latent_dim)).astype(np.float32)
  text = rng.normal(size=(n, CONFIG.text_dim)).astype(np.float32)
  kinds = rng.integers(0, 2, n)
  actions, _ = wm.action_bytes([("Click(1, 2)" if k else 'Key("Enter")') for k in kinds], CONFIG.action_len)
  sign = np.where(kinds[:, None] == 1, 1.0, -1.0).astype(np.float32)
  return {"latent": latent, "text": text, "actions": actions, "next_latent": np.roll(latent, 1, -1) * sign,
          "next_text": text[:, ::-1] * sign, "mask": np.ones(n, bool), "row": np.arange(n, dtype=np.int32)}


def _model(batches, learning_rate=3e-3):
  mesh = make_mesh((-1, 1, 1), ("data", "fsdp", "tensor"))
  spec = AuxModelSpec(init=functools.partial(wm.init, config=CONFIG), loss=functools.partial(wm.loss, config=CONFIG),
                      batches=batches, param_axes=wm.param_axes(CONFIG), phase="before_rewards",
                      learning_rate=learning_rate, keep_outputs=True, betas=(0.9, 0.95))
  return AuxModel("world_model", spec, mesh, sharding.DEFAULT_RULES, jax.random.key(0))


def test_action_bytes_pad_and_cut():
  ids, mask = wm.action_bytes(["Ab", ""], 3)
  np.testing.assert_array_equal(ids, [[ord("A") + 1, ord("b") + 1, 0], [0, 0, 0]])
  np.testing.assert_array_equal(mask, [[True, True, False], [False, False, False]])
  assert wm.action_bytes(["abcdef"], 4)[0].tolist() == [[98, 99, 100, 101]]


def test_kernels_carry_logical_axes():
  axes = wm.param_axes(CONFIG)
  assert axes["action_embed"]["embedding"] == ("vocab", "embed")
  assert axes["block_0"]["query"]["kernel"] == ("embed", "mlp")
  assert axes["text_out"]["down"]["kernel"] == ("mlp", "embed")


def test_world_model_learns_a_fixed_transition():
  data = _transitions(32)
  model = _model(lambda records: [records] * 300)
  first, _ = wm.loss(model.params, data, CONFIG)
  metrics = model.train(data)
  last, _ = wm.loss(model.params, data, CONFIG)
  assert metrics["world_model/steps"] == 300
  # The targets have unit variance per value: predicting zeros costs 2.0; the learned map is far below.
  assert float(first) > 1.5 and float(last) < 0.1 * float(first), (float(first), float(last))


def test_kept_outputs_are_the_last_epochs_predictions_before_each_update():
  data = _transitions(20, seed=1)
  # Batches of 8 rows (the test mesh's 8 devices), the last one padded; the last epoch goes in reverse order.
  order = [np.arange(8), np.arange(8, 16), np.array([16, 17, 18, 19, -1, -1, -1, -1])]

  def batches(records):
    out = []
    for epoch in range(3):
      for rows in order[::-1] if epoch == 2 else order:
        rows = np.asarray(rows)
        batch = {k: v[np.maximum(rows, 0)] for k, v in records.items()}
        batch["row"] = rows.astype(np.int32)
        batch["mask"] = rows >= 0
        out.append(batch)
    return out

  model = _model(batches)
  # What the last epoch computes: replay the same steps by hand up to each of its batches.
  model_copy = _model(batches)
  expected = {}
  for i, batch in enumerate(batches(data)):
    if i >= 6:
      latent, text = wm.predict(model_copy.params, batch, CONFIG)
      for r, lat, tx in zip(batch["row"], np.asarray(latent), np.asarray(text)):
        if r >= 0:
          expected[int(r)] = (lat, tx)
    model_copy.state, _ = model_copy._step(model_copy.state, {k: np.asarray(v) for k, v in batch.items()})
  model.train(data)
  out = model.outputs
  assert out["seen"].tolist() == [True] * 20
  for r, (lat, tx) in expected.items():
    np.testing.assert_allclose(out["latent"][r], lat, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["text"][r], tx, rtol=1e-5, atol=1e-6)
  final_latent, _ = wm.predict(model.params, data, CONFIG)
  assert not np.allclose(out["latent"], np.asarray(final_latent), atol=1e-4)  # not the trained model's


def test_last_outputs_later_steps_win_and_padding_is_dropped():
  steps = [{"row": np.array([0, 2]), "x": np.array([1.0, 2.0])}, {"row": np.array([2, -1]), "x": np.array([5.0, 9.0])}]
  out = last_outputs(steps)
  np.testing.assert_array_equal(out["x"], [1.0, 0.0, 5.0])
  np.testing.assert_array_equal(out["seen"], [True, False, True])
