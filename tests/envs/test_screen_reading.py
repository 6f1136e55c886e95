"""Screen reading: OCR boxes on a drawn image, the patch_stats latent by hand."""

import pathlib

import matplotlib
import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from explore_jax.envs import screen_reading

FONT = pathlib.Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"


def test_ocr_boxes_find_drawn_words():
  image = Image.new("RGB", (320, 240), "white")
  draw = ImageDraw.Draw(image)
  font = ImageFont.truetype(str(FONT), 16)
  draw.text((20, 30), "Hello desktop world", fill="black", font=font)
  draw.text((40, 150), "Second line here", fill="black", font=font)
  boxes = screen_reading.ocr_boxes(np.asarray(image), upscale=2)
  texts = [b.text for b in boxes]
  assert "Hello desktop world" in texts and "Second line here" in texts
  first = boxes[texts.index("Hello desktop world")]
  assert first.x0 <= 24 and first.y0 <= 36 <= first.y1 and first.x1 >= 150
  second = boxes[texts.index("Second line here")]
  assert second.y0 <= 156 <= second.y1 and second.x0 <= 44


def test_patch_stats_by_hand():
  screen = np.zeros((10, 17, 3), np.uint8)  # unequal H, W: cells of 1-2 rows and 2-3 columns
  screen[:, :, 0] = 255
  latent = screen_reading.image_latent("patch_stats", screen)
  assert latent.shape == (384,) and latent.dtype == np.float32
  cells = latent.reshape(8, 8, 2, 3)
  np.testing.assert_allclose(cells[..., 0, :], np.broadcast_to([1.0, -1.0, -1.0], (8, 8, 3)))
  np.testing.assert_allclose(cells[..., 1, :], 0.0)
  screen[0, 0] = (0, 0, 0)  # cell (0, 0) is rows 0 (and 1), columns 0..1 or 0..2
  edges_r, edges_c = screen_reading._cell_edges(10, 8), screen_reading._cell_edges(17, 8)
  cell = screen[edges_r[0]:edges_r[1], edges_c[0]:edges_c[1], 0].astype(float)
  changed = screen_reading.patch_stats(screen).reshape(8, 8, 2, 3)
  assert changed[0, 0, 0, 0] == pytest.approx(2 * cell.mean() / 255 - 1, abs=1e-6)
  assert changed[0, 0, 1, 0] == pytest.approx(2 * cell.std() / 255, abs=1e-6)
  np.testing.assert_array_equal(changed[1:], cells[1:])
  with pytest.raises(ValueError):
    screen_reading.image_latent("cosmos", screen)
