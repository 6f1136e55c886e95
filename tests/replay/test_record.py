"""The record: spec shapes and logical axes, padding rows, extras only when declared, from_host packing
and its errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from explore_jax.replay import ExtraField, RecordSpec, fold_state_key, from_host, take

SPEC = RecordSpec(prompt_len=6, response_len=4, intrinsic_names=("rnd", "count"))


def step(i=0, **overrides):
  row = dict(prompt_tokens=[11, 12, 13], response_tokens=[21, 22], behaviour_logprobs=[-0.5, -1.5],
             task_reward=1.0, group_id=3, traj_id=i, step_index=2, policy_version=7, done=True,
             intrinsic={"rnd": 0.25, "count": -1.0})
  row.update(overrides)
  return row


def test_shapes_dtypes_and_axes():
  s = SPEC.shapes(5)
  assert s.prompt_tokens.shape == (5, 6) and s.prompt_tokens.dtype == jnp.int32
  assert s.response_mask.shape == (5, 4) and s.response_mask.dtype == jnp.bool_
  assert s.intrinsic_rewards.shape == (5, 2) and s.state_key.dtype == jnp.int32
  axes = SPEC.logical_axes()
  assert axes.prompt_tokens == ("batch", "length") and axes.behaviour_logprobs == ("batch", "length")
  assert axes.intrinsic_rewards == ("batch", None) and axes.valid == ("batch",)
  assert hash(SPEC) == hash(RecordSpec(6, 4, ["rnd", "count"]))


def test_empty_rows_are_invalid_padding():
  spec = RecordSpec(6, 4, pad_id=9)
  host, device = spec.empty(3), spec.zeros(3)
  assert isinstance(host.valid, np.ndarray) and isinstance(device.valid, jax.Array)
  for r in (host, device):
    assert not np.asarray(r.valid).any() and not np.asarray(r.prompt_mask).any()
    assert (np.asarray(r.prompt_tokens) == 9).all() and (np.asarray(r.segment_ids) == -1).all()
    assert r.intrinsic_rewards.shape == (3, 0)


def test_extras_present_only_when_declared():
  assert SPEC.zeros(2).extras == {}
  plain = len(jax.tree.leaves(SPEC.zeros(2)))
  spec = RecordSpec(6, 4, extras={"alt_prompt_tokens": ((6,), "int32", ("length",), "left"),
                                  "diversity_weight": ((), np.float32),
                                  "embedding": ExtraField((3,), "float32")})
  r = spec.zeros(2)
  assert sorted(r.extras) == ["alt_prompt_tokens", "diversity_weight", "embedding"]
  assert len(jax.tree.leaves(r)) == plain + 3
  assert r.extras["alt_prompt_tokens"].shape == (2, 6) and r.extras["embedding"].dtype == jnp.float32
  assert spec.logical_axes().extras["alt_prompt_tokens"] == ("batch", "length")
  assert spec.logical_axes().extras["embedding"] == ("batch", None)
  with pytest.raises(ValueError, match="reuse names"):
    RecordSpec(6, 4, extras={"traj_id": ((), "int32")})


def test_from_host_packs_left_and_right():
  r = from_host(SPEC, [step(0), step(1, prompt_tokens=[1, 2, 3, 4, 5, 6], response_tokens=[7, 8, 9, 10],
                                      behaviour_logprobs=[-1.0] * 4, temperatures=[0.5] * 4,
                                      segment_ids=[0, 0, 1, 1], state_key=-5)])
  np.testing.assert_array_equal(r.prompt_tokens[0], [0, 0, 0, 11, 12, 13])
  np.testing.assert_array_equal(r.prompt_mask[0], [False, False, False, True, True, True])
  np.testing.assert_array_equal(r.response_tokens[0], [21, 22, 0, 0])
  np.testing.assert_array_equal(r.response_mask[0], [True, True, False, False])
  np.testing.assert_array_equal(r.behaviour_logprobs[0], [-0.5, -1.5, 0, 0])
  np.testing.assert_array_equal(r.temperatures[0], [1, 1, 0, 0])  # default temperature 1 on real tokens
  np.testing.assert_array_equal(r.segment_ids[0], [0, 0, -1, -1])
  np.testing.assert_array_equal(r.prompt_tokens[1], [1, 2, 3, 4, 5, 6])
  np.testing.assert_array_equal(r.segment_ids[1], [0, 0, 1, 1])
  np.testing.assert_array_equal(r.intrinsic_rewards, [[0.25, -1.0], [0.25, -1.0]])
  np.testing.assert_array_equal(SPEC.intrinsic(r, "count"), [-1.0, -1.0])
  assert r.state_key.tolist() == [0, -5] and r.traj_id.tolist() == [0, 1] and r.valid.all()
  assert r.prompt_tokens.dtype == np.int32 and r.task_reward.dtype == np.float32
  SPEC.check(r)


def test_from_host_applies_masks_like_sampler_rows():
  # A row of a left-padded prompt batch and of SampleOutput (pad after the end, mask False there).
  r = from_host(SPEC, [step(prompt_tokens=[0, 0, 0, 0, 5, 6], prompt_mask=[0, 0, 0, 0, 1, 1],
                            response_tokens=[4, 3, 0, 0, 0], response_mask=[1, 1, 0, 0, 0],
                            behaviour_logprobs=[-1, -2, 0, 0, 0], temperatures=[0.7, 0.7, 0, 0, 0],
                            segment_ids=[0, 1, -1, -1, -1])])
  np.testing.assert_array_equal(r.prompt_tokens[0], [0, 0, 0, 0, 5, 6])
  np.testing.assert_array_equal(r.prompt_mask[0], [0, 0, 0, 0, 1, 1])
  np.testing.assert_array_equal(r.response_tokens[0], [4, 3, 0, 0])
  np.testing.assert_allclose(r.temperatures[0], [0.7, 0.7, 0, 0])
  np.testing.assert_array_equal(r.segment_ids[0], [0, 1, -1, -1])


def test_from_host_columns_equal_rows_and_pad_to():
  rows = [step(i, policy_version=i) for i in range(3)]
  cols = {k: [row[k] for row in rows] for k in rows[0] if k != "intrinsic"}
  cols["intrinsic"] = {"rnd": [0.25] * 3, "count": np.full(3, -1.0)}
  a, b = from_host(SPEC, rows, pad_to=5), from_host(SPEC, cols, pad_to=5)
  jax.tree.map(np.testing.assert_array_equal, a, b)
  assert a.valid.tolist() == [True] * 3 + [False] * 2
  assert (a.prompt_tokens[3:] == 0).all() and (a.segment_ids[3:] == -1).all()
  with pytest.raises(ValueError, match="do not fit"):
    from_host(SPEC, rows, pad_to=2)


def test_from_host_errors_name_the_field():
  with pytest.raises(ValueError, match="record 1: prompt_tokens has 7 tokens, more than prompt_len=6"):
    from_host(SPEC, [step(), step(prompt_tokens=list(range(7)))])
  with pytest.raises(ValueError, match="response_tokens has 5 tokens, more than response_len=4"):
    from_host(SPEC, [step(response_tokens=[1] * 5, behaviour_logprobs=[0.0] * 5)])
  with pytest.raises(ValueError, match="behaviour_logprobs has shape"):
    from_host(SPEC, [step(behaviour_logprobs=[0.0])])
  with pytest.raises(ValueError, match=r"missing field\(s\) \['done'\]"):
    from_host(SPEC, [{k: v for k, v in step().items() if k != "done"}])
  with pytest.raises(ValueError, match="unknown field"):
    from_host(SPEC, [step(rewardd=1.0)])
  with pytest.raises(ValueError, match="intrinsic terms"):
    from_host(SPEC, [step(intrinsic={"rnd": 1.0})])
  with pytest.raises(ValueError, match="group_id"):
    from_host(SPEC, [step(group_id=2**40)])
  with pytest.raises(ValueError, match="differ in length"):
    from_host(SPEC, {"task_reward": [1.0, 2.0], "done": [True]})


def test_from_host_extras():
  spec = RecordSpec(6, 4, extras={"alt_prompt_tokens": ExtraField((6,), "int32", ("length",), pad="left"),
                                  "embedding": ((3,), "float32")})
  base = {k: v for k, v in step().items() if k != "intrinsic"}
  r = from_host(spec, [dict(base, alt_prompt_tokens=[12, 13], embedding=[1.0, 2.0, 3.0])])
  np.testing.assert_array_equal(r.extras["alt_prompt_tokens"][0], [0, 0, 0, 0, 12, 13])
  np.testing.assert_array_equal(r.extras["embedding"][0], [1, 2, 3])
  with pytest.raises(ValueError, match="alt_prompt_tokens has 7 entries"):
    from_host(spec, [dict(base, alt_prompt_tokens=list(range(7)), embedding=[1.0, 2.0, 3.0])])
  with pytest.raises(ValueError, match=r"embedding has shape \(2,\)"):
    from_host(spec, [dict(base, alt_prompt_tokens=[1], embedding=[1.0, 2.0])])
  with pytest.raises(ValueError, match="missing"):
    from_host(spec, [base])


def test_fold_state_key():
  assert fold_state_key(12345) == 12345 and fold_state_key(-7) == -7
  wide = 0x0123456789ABCDEF
  folded = fold_state_key(wide)
  assert -2**31 <= folded < 2**31 and folded == np.int32(np.uint32((wide ^ (wide >> 32)) & 0xFFFFFFFF).view(np.int32))
  assert fold_state_key(wide) != fold_state_key(wide + 1)
  assert -2**31 <= fold_state_key(-2**63) < 2**31


def test_take_rows():
  r = from_host(SPEC, [step(i) for i in range(4)])
  np.testing.assert_array_equal(take(r, np.array([3, 1])).traj_id, [3, 1])
