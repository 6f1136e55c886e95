"""Screen reading: OCR boxes on drawn text and their inclusive bounds, the patch_stats latent by hand."""

import pathlib

import matplotlib
import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from explore_jax.envs import screen_reading

FONT = pathlib.Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"


def _ink_box(image: np.ndarray, rows: slice) -> tuple[int, int, int, int]:
  """The inclusive box (x0, y0, x1, y1) of the non-white pixels within `rows`."""
  ys, xs = np.nonzero(image[rows].min(axis=2) < 255)
  return xs.min(), ys.min() + rows.start, xs.max(), ys.max() + rows.start


@pytest.mark.parametrize("size, font_size, upscale", [((320, 240), 16, 1), ((320, 240), 16, 2), ((160, 210), 11, None)])
def test_ocr_boxes_read_drawn_lines_in_their_ink(size, font_size, upscale):
  image = Image.new("RGB", size, "white")
  draw = ImageDraw.Draw(image)
  font = ImageFont.truetype(str(FONT), font_size)
  first, second = "Hello desktop world", "Second line here"
  draw.text((10, 20), first, fill="black", font=font)
  draw.text((25, 120), second, fill="black", font=font)
  screen = np.asarray(image)
  options = {} if upscale is None else {"upscale": upscale}  # None: the defaults, on a MiniWoB-sized screen
  boxes = screen_reading.ocr_boxes(screen, **options)
  assert [b.text for b in boxes] == [first, second]
  for box, rows in zip(boxes, (slice(0, 100), slice(100, None))):
    ink = _ink_box(screen, rows)
    # The box is the line's ink, its last pixels included: within a pixel of the ink's inclusive box.
    assert np.abs(np.subtract((box.x0, box.y0, box.x1, box.y1), ink)).max() <= 1, (box, ink)
    assert box.x0 <= ink[0] + 1 and box.y0 <= ink[1] + 1 and box.x1 >= ink[2] - 1 and box.y1 >= ink[3] - 1
    assert screen[box.y0:box.y1 + 1, box.x0:box.x1 + 1].min() < 128  # ink inside the inclusive box


def test_ocr_boxes_bounds_are_inclusive(monkeypatch):
  """tesseract's boxes (left, top, width, height) in the scaled image -> inclusive screenshot pixels."""
  import pytesseract

  words = [  # (block, par, line, left, top, width, height, text) in the image scaled 3x
      (1, 1, 1, 30, 60, 30, 15, "Open"),    # columns 30..59 -> 10..19, rows 60..74 -> 20..24
      (1, 1, 1, 66, 58, 13, 12, "file"),    # columns 66..78 -> 22..26, rows 58..69 -> 19..23
      (1, 1, 1, 80, 58, 5, 5, "  "),        # an empty word: no part of the line
      (1, 1, 2, 4, 90, 5, 4, "x"),          # columns 4..8 -> 1..2, rows 90..93 -> 30..31
      (2, 1, 1, 141, 110, 9, 10, "edge"),   # columns 141..149 -> 47..49, rows 110..119 -> 36..39 (the last)
      (2, 1, 2, 0, 0, 0, 0, ""),
  ]

  def image_to_data(image, lang, config, output_type):
    assert image.size == (150, 120) and config == "--psm 6"
    keys = ("block_num", "par_num", "line_num", "left", "top", "width", "height", "text")
    return {key: [w[k] for w in words] for k, key in enumerate(keys)}

  monkeypatch.setattr(pytesseract, "image_to_data", image_to_data)
  boxes = screen_reading.ocr_boxes(np.zeros((40, 50, 3), np.uint8), upscale=3, psm=6)
  assert [b.as_list() for b in boxes] == [[10, 19, 26, 24, "Open file"], [1, 30, 2, 31, "x"], [47, 36, 49, 39, "edge"]]
  inside = lambda b, x, y: b.x0 <= x <= b.x1 and b.y0 <= y <= b.y1  # rl/screen_rewards.py's click_hit_text
  assert inside(boxes[0], 26, 24) and not inside(boxes[0], 27, 24) and not inside(boxes[0], 26, 25)
  assert inside(boxes[2], 49, 39)  # the screenshot's last pixel


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
