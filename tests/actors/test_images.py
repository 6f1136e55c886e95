"""Images in prompts on the actors' side (explore_jax/images.py, PromptTokenizer): the processor's resize rule,
the image tokens of a prompt, the tower's input, and an actor sending a screenshot with its request."""

import numpy as np
import pytest

from explore_jax import hf
from explore_jax.actors.actor import Actor, ActorConfig, PromptTokenizer
from explore_jax.actors.protocol import EpisodeSpec, Prompt, PromptRequest
from explore_jax.images import IMAGE, ImageLayout, smart_resize
from explore_jax.models.config import VL_PRESETS
from explore_jax.models import vision as vision_lib

CONFIG = VL_PRESETS["tiny-vl"]
LAYOUT = ImageLayout.from_config(CONFIG)


def test_the_processors_resize_rule_by_hand():
  assert smart_resize(160, 210, 28, 56 * 56, 28 * 28 * 1280) == (168, 224)   # a MiniWoB screenshot: round
  assert smart_resize(28, 28, 28, 56 * 56, 28 * 28 * 1280) == (56, 56)        # too small: scaled up
  # Too large: beta = sqrt(2000 * 3000 / 1003520) = 2.4452, sides floor(2000 / beta / 28) = 29 and 43 blocks.
  assert smart_resize(2000, 3000, 28, 56 * 56, 28 * 28 * 1280) == (812, 1204)
  h, w = smart_resize(2000, 3000, 28, 56 * 56, 28 * 28 * 1280)
  assert h * w <= 28 * 28 * 1280 and h % 28 == w % 28 == 0
  with pytest.raises(ValueError, match="aspect ratio"):
    smart_resize(1, 500, 28, 56 * 56, 28 * 28 * 1280)


def test_an_image_becomes_its_merged_tokens_and_the_towers_patches():
  screenshot = np.random.default_rng(0).integers(0, 256, (160, 210, 3), dtype=np.uint8)
  resized = LAYOUT.resize(screenshot)
  assert resized.shape == (168, 224, 3) and resized.dtype == np.uint8
  assert LAYOUT.resize(resized) is resized  # already at its size: untouched
  assert LAYOUT.grid(resized) == (1, 12, 16) and LAYOUT.num_tokens(resized) == 48
  patches, grids = LAYOUT.pixel_values([resized, resized[:56, :56]])
  assert patches.shape == (12 * 16 + 4 * 4, CONFIG.vision.patch_dim) and grids.tolist() == [[1, 12, 16], [1, 4, 4]]
  # The same layout as the model's own patchify on the normalised image.
  normalised = (resized.astype(np.float32) / 255 - np.array([0.48145466, 0.4578275, 0.40821073], np.float32)) \
      / np.array([0.26862954, 0.26130258, 0.27577711], np.float32)
  np.testing.assert_allclose(patches[:192], vision_lib.patchify(normalised, CONFIG.vision)[0], atol=1e-6)
  with pytest.raises(ValueError, match="uint8"):
    LAYOUT.resize(screenshot.astype(np.float32))
  with pytest.raises(ValueError, match="not at a target size"):
    LAYOUT.grid(screenshot)


@pytest.fixture(scope="module")
def tokenizer():
  return PromptTokenizer.from_dir(hf.tiny_vl_dir(), max_prompt_tokens=200, image_layout=LAYOUT)


def test_a_prompt_lays_each_image_out_as_the_processor_does(tokenizer):
  a = LAYOUT.resize(np.zeros((56, 84, 3), np.uint8))     # 2 x 3 merged tokens
  b = LAYOUT.resize(np.zeros((112, 56, 3), np.uint8))    # 4 x 2
  messages = [{"role": "user", "content": f"first {IMAGE} then {IMAGE} click"}]
  ids, cut = tokenizer.encode(messages, (a, b))
  assert cut == 0
  start, pad, end = LAYOUT.start_id, LAYOUT.pad_id, LAYOUT.end_id
  i = ids.index(start)
  assert ids[i:i + 8] == [start] + [pad] * 6 + [end]
  j = ids.index(start, i + 1)
  assert ids[j:j + 10] == [start] + [pad] * 8 + [end] and ids.count(pad) == 14
  text, _ = tokenizer.encode([{"role": "user", "content": "first  then  click"}])
  assert [t for t in ids if t not in (start, pad, end)] != [] and len(ids) > len(text)
  # Wrong counts and budgets are errors, never a silently cut image.
  with pytest.raises(ValueError, match="2 image tokens for 1 images"):
    tokenizer.encode(messages, (a,))
  small = PromptTokenizer(tokenizer.tokenizer, max_prompt_tokens=12, image_layout=LAYOUT)
  with pytest.raises(ValueError, match="max_prompt_tokens=12: an image cannot be cut"):
    small.encode(messages, (a, b))
  plain = PromptTokenizer(tokenizer.tokenizer, max_prompt_tokens=200)
  with pytest.raises(ValueError, match="not a vision-language model"):
    plain.encode(messages, (a, b))


def _screenshot_hook(observation, history, context, info):
  return Prompt([{"role": "user", "content": f"{IMAGE}\n{observation['text']}"}], images=[observation["screenshot"]])


class _ScreenEnv:
  """A one-step environment whose observation is a screenshot and an utterance (as MiniWoB-v0's)."""

  def __init__(self):
    self.image = np.full((60, 90, 3), 7, np.uint8)

  def reset(self, seed=None, options=None):
    return {"screenshot": self.image, "text": "Task: click"}, {}

  def step(self, action):
    return {"screenshot": self.image, "text": "done"}, 1.0, True, False, {"success": True, "state_key": 3}

  def close(self):
    pass


def test_an_actor_sends_the_resized_screenshot_with_its_request(tokenizer, monkeypatch):
  sent = []
  config = ActorConfig(actor_id=0, tokenizer_dir=hf.tiny_vl_dir(), prompt_hook=_screenshot_hook, envs_per_actor=1,
                       max_prompt_tokens=200, image_layout=LAYOUT)
  actor = Actor(config, tokenizer, sent.append)
  monkeypatch.setattr(actor.envs, "acquire", lambda env_id, kwargs: _ScreenEnv())
  monkeypatch.setattr(actor.envs, "release", lambda env_id, kwargs, env: None)
  actor.handle(EpisodeSpec(episode_id=4, group_id=0, traj_id=0, env_id="screen"))
  request = sent[-1]
  assert isinstance(request, PromptRequest) and len(request.images) == 1
  image = request.images[0]
  assert image.shape == (56, 84, 3) and image.dtype == np.uint8
  assert request.prompt_ids.count(LAYOUT.pad_id) == LAYOUT.num_tokens(image) == 6
