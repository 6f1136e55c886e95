"""ScreenExplorer's reward terms and diversity measures against hand-computed cases (rl/screen_rewards.py)."""

import numpy as np
import pytest

from explore_jax.rl import screen_rewards as sr


def test_cosine_clamps_each_norm_so_a_zero_vector_gives_zero():
  a = np.array([[3.0, 4.0], [0.0, 0.0], [1e-9, 0.0]])
  b = np.array([[4.0, 3.0], [1.0, 2.0], [1.0, 0.0]])
  # 24/25; 0 (zero vector); |a| = 1e-9 < eps, so 1e-9 * 1 / (1e-8 * 1) = 0.1 (torch clamps each norm on its own).
  np.testing.assert_allclose(sr.cosine(a, b), [24 / 25, 0.0, 0.1], rtol=1e-6)


def test_instant_change_is_zero_on_an_unchanged_screen_and_one_when_orthogonal():
  before = np.array([[1.0, 0.0], [1.0, 1.0]])
  after = np.array([[0.0, 2.0], [1.0, 1.0]])
  np.testing.assert_allclose(sr.instant_change(before, after), [1.0, 0.0], atol=1e-6)


def test_world_model_surprise_is_zero_for_a_perfect_prediction():
  after = np.array([[0.2, -0.5, 1.0], [1.0, 0.0, 0.0]])
  predicted = np.array([[0.2, -0.5, 1.0], [-1.0, 0.0, 0.0]])
  np.testing.assert_allclose(sr.world_model_surprise(after, predicted), [0.0, 2.0], atol=1e-6)


def test_intent_terms():
  intent = np.array([[1.0, 0.0], [0.0, 0.0]])
  before, after = np.array([[1.0, 1.0], [1.0, 0.0]]), np.array([[0.0, 1.0], [0.0, 1.0]])
  np.testing.assert_allclose(sr.intent_alignment(intent, before, after), [np.sqrt(0.5), 0.0], atol=1e-6)
  box = np.array([[2.0, 0.0], [1.0, 0.0]])
  np.testing.assert_allclose(sr.intent_box(intent, box, [True, True]), [1.0, 0.0], atol=1e-6)
  np.testing.assert_allclose(sr.intent_box(intent, box, [False, True]), [0.0, 0.0], atol=1e-6)


# Three unit states: e0, e1, and (e0 + e1)/sqrt(2); sim(e0, e1) = 0, sim(e0, m) = sim(e1, m) = 1/sqrt(2).
E0, E1 = np.array([1.0, 0.0]), np.array([0.0, 1.0])
M = np.array([1.0, 1.0]) / np.sqrt(2)
H = 1 / np.sqrt(2)


def test_sequence_change_paper_form_by_hand():
  after = np.stack([E0, E1, M, E0])[None]          # x'_0 .. x'_3
  first = E1[None]
  got = np.asarray(sr.sequence_change(first, after, np.ones((1, 4), bool), "paper"))[0]
  # t=1: i=0, j in {2,3}: (1 - H) + (1 - 1) -> (1 - H)/2;  t=2: i in {0,1}, j=3: (1-1) + (1-0) -> 1/2;
  # t=0 and t=3 have no pair on one side: 0.
  np.testing.assert_allclose(got, [0.0, (1 - H) / 2, 0.5, 0.0], atol=1e-6)


def test_sequence_change_code_form_by_hand():
  after = np.stack([E0, E1, M])[None]
  first = E1[None]
  got = np.asarray(sr.sequence_change(first, after, np.ones((1, 3), bool), "code"))[0]
  # S over [x0=E1, E0, E1, M]; step t gets 1 - mean(S[0:t+1, t+1:]).
  seq = np.stack([E1, E0, E1, M])
  S = seq @ seq.T
  want = [1 - S[0:t + 1, t + 1:].mean() for t in range(3)]
  np.testing.assert_allclose(got, want, atol=1e-6)
  np.testing.assert_allclose(want, [1 - (0 + 1 + H) / 3, 1 - (1 + 0 + H + H) / 4, 1 - (H + H + H) / 3], atol=1e-9)


def test_sequence_change_code_form_counts_only_masked_steps():
  """The code scores the well-formed steps only: a masked-out step leaves the sequence and scores 0."""
  after = np.stack([E0, M, E1, M])[None]
  mask = np.array([[True, False, True, True]])
  got = np.asarray(sr.sequence_change(E1[None], after, mask, "code"))[0]
  compact = np.asarray(sr.sequence_change(E1[None], np.stack([E0, E1, M])[None], np.ones((1, 3), bool), "code"))[0]
  np.testing.assert_allclose(got, [compact[0], 0.0, compact[1], compact[2]], atol=1e-6)


def test_sequence_change_rejects_an_unknown_form():
  with pytest.raises(ValueError, match="sequence form"):
    sr.sequence_change(E0[None], E0[None, None], np.ones((1, 1), bool), "both")


def test_total_gates_by_format_or_adds_it_as_a_term():
  terms = {"a": np.array([0.5, 0.5]), "b": np.array([0.25, 1.0])}
  np.testing.assert_allclose(sr.total(terms, [1.0, 0.0], gate=True), [0.75, 0.0])
  np.testing.assert_allclose(sr.total(terms, [1.0, 0.0], gate=False), [1.75, 1.5])


def test_diversity_measures_as_printed():
  same = np.stack([E0, E0, E0])[None]
  np.testing.assert_allclose(sr.sequence_diversity(same, np.ones((1, 3), bool)), [0.0], atol=1e-6)
  orth = np.stack([E0, E1])[None]
  # One pair of dissimilarity 1, divided by T (T - 1) = 2.
  np.testing.assert_allclose(sr.sequence_diversity(orth, np.ones((1, 2), bool)), [0.5], atol=1e-6)
  group = np.stack([E0, E1, M, E0])
  pairs = [(0, 1, 1.0), (0, 2, 1 - H), (0, 3, 0.0), (1, 2, 1 - H), (1, 3, 1.0), (2, 3, 1 - H)]
  np.testing.assert_allclose(sr.group_diversity(group, np.ones(4, bool)), sum(p[2] for p in pairs) / 12, atol=1e-6)
  np.testing.assert_allclose(sr.group_diversity(group, np.array([True, True, False, False])), 0.5, atol=1e-6)
  np.testing.assert_allclose(sr.group_diversity(group, np.array([True, False, False, False])), 0.0)


def test_click_hit_text_uses_inclusive_bounds_and_clicks_only():
  boxes = [[10, 10, 20, 20, " File "], [15, 5, 40, 20, "Edit"], [50, 50, 60, 60, "Help"]]
  assert sr.click_hit_text(boxes, "Click", 20, 20) == "Screen OCR: File Edit"
  assert sr.click_hit_text(boxes, "DoubleClick", 10, 10) == "Screen OCR: File"
  assert sr.click_hit_text(boxes, "RightClick", 45, 45) is None
  assert sr.click_hit_text(boxes, "Move", 12, 12) is None
  assert sr.click_hit_text(boxes, "Text", 12, 12) is None
  assert sr.screen_text(boxes) == "Screen OCR:  File  Edit Help"
  assert sr.screen_text([]) == "Screen OCR: "
