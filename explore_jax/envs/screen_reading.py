"""Reading a GUI world's screen: line-level OCR boxes and an image latent that moves when the screen changes.

Both run inside actor processes (no jax), on the uint8 [H, W, 3] screenshots of the GUI worlds (MiniWoB-v0).

- `ocr_boxes(screenshot)`: tesseract (Debian's `tesseract-ocr`, through pytesseract's `image_to_data`) reads
  the screenshot; its words are grouped by (block, paragraph, line) into one `OcrBox` per line, the line's
  words joined by one space, empty lines dropped, boxes in screenshot pixels with inclusive bounds (x1, y1 the
  last pixel inside, as rl/screen_rewards.py's `click_hit_text` tests them). The settings, measured on
  MiniWoB-v0's and an X desktop's screenshots against the words they show (benchmarks/ocr.py; the table and the
  reasons in benchmarks/README.md, "OCR"):
  * `gray` (default True): the screenshot goes to tesseract as 8-bit luma. Given RGB, tesseract lost MiniWoB's
    black-on-yellow task text on many pages (word recall 0.71-0.80 at upscale 2-4, 0.90-0.95 in gray).
  * `upscale` (default 3): the image is scaled up (bicubic) before OCR and the boxes mapped back; MiniWoB's
    11-pixel text reads badly at 1 (recall 0.79).
  * `psm` (default 3, tesseract's automatic page layout): 6 (one uniform block) reads MiniWoB's single column a
    little better (at upscale 2: recall 0.94 against the defaults' 0.91, with about 7% less CPU) but lost
    title bars and whole lines of a second window on the desktop (0.93 against 0.97); 11 and 12 (sparse text)
    read more noise, 12 at twice the time; 4 read as 3 did.
  * tesseract runs on one OpenMP thread: `OMP_THREAD_LIMIT` is set to 1 when the environment does not set it
    (actors run their tesseracts side by side; on 2 busy cores its threads made a call 5-15x slower at the
    defaults).
  About 130 ms of CPU per 160 x 210 MiniWoB screenshot and 330 ms per 640 x 480 desktop at the defaults.
  Tesseract's legacy engine (--oem 0) is not in Debian's eng.traineddata; the LSTM engine is the only one.
- `image_latent(name, screenshot)`: a vector per screenshot, chosen by name from `LATENTS`. "patch_stats"
  splits the screen into an 8 x 8 grid of nearly equal cells (any H, W) and keeps, per cell and RGB channel,
  the centred mean (2 mean / 255 - 1) and the scaled standard deviation (2 std / 255): D = 8 * 8 * 3 * 2 =
  384. A change on the screen moves the colours and the textures of the cells it touches; centring makes a
  cosine between two latents sensitive to it where raw colours of a mostly white screen all point the same
  way. ScreenExplorer's Cosmos tokenizer latent cannot be had here (no weights); this one is deterministic,
  pure numpy and swappable by name.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import numpy as np
from PIL import Image

GRID = 8


@dataclasses.dataclass(frozen=True)
class OcrBox:
  """One line of text read from a screenshot: its box in screenshot pixels and its text. The bounds are
  inclusive: (x0, y0) is the box's first pixel and (x1, y1) its last, so a point (x, y) is on the box when
  x0 <= x <= x1 and y0 <= y <= y1 (rl/screen_rewards.py's `click_hit_text`)."""

  x0: int
  y0: int
  x1: int
  y1: int
  text: str

  def as_list(self) -> list:
    return [self.x0, self.y0, self.x1, self.y1, self.text]


def ocr_boxes(screenshot: np.ndarray, *, upscale: int = 3, psm: int = 3, gray: bool = True,
              lang: str = "eng") -> list[OcrBox]:
  """Line-level OCR boxes of a uint8 [H, W, 3] screenshot, in reading order (tesseract's); the settings as in
  the module docstring."""
  import pytesseract  # only where OCR runs

  if upscale < 1:
    raise ValueError(f"upscale must be at least 1, got {upscale}")
  # One OpenMP thread per tesseract unless the caller's environment says otherwise (module docstring).
  os.environ.setdefault("OMP_THREAD_LIMIT", "1")
  height, width = screenshot.shape[:2]
  with Image.fromarray(np.ascontiguousarray(screenshot, dtype=np.uint8)) as image:
    source = image.convert("L") if gray else image
    scaled = source.resize((width * upscale, height * upscale), Image.Resampling.BICUBIC) if upscale > 1 else source
    data = pytesseract.image_to_data(scaled, lang=lang, config=f"--psm {psm}",
                                     output_type=pytesseract.Output.DICT)
  lines: dict[tuple[int, int, int], list[int]] = {}
  for i, word in enumerate(data["text"]):
    if word and word.strip():
      lines.setdefault((data["block_num"][i], data["par_num"][i], data["line_num"][i]), []).append(i)
  boxes = []
  for indices in lines.values():
    left = min(data["left"][i] for i in indices)
    top = min(data["top"][i] for i in indices)
    right = max(data["left"][i] + data["width"][i] for i in indices)  # exclusive, in scaled pixels
    bottom = max(data["top"][i] + data["height"][i] for i in indices)
    text = " ".join(data["text"][i].strip() for i in indices)
    # The last scaled pixel inside (right - 1) lies in the screenshot pixel (right - 1) // upscale.
    boxes.append(OcrBox(left // upscale, top // upscale, min(width - 1, (right - 1) // upscale),
                        min(height - 1, (bottom - 1) // upscale), text))
  return boxes


def _cell_edges(size: int, cells: int) -> np.ndarray:
  """Edges of `cells` nearly equal cells over `size` pixels (sizes differ by at most one)."""
  return np.linspace(0, size, cells + 1).round().astype(int)


def patch_stats(screenshot: np.ndarray) -> np.ndarray:
  """The "patch_stats" latent (module docstring): float32 [8 * 8 * 3 * 2], per cell (row-major) the three
  centred channel means, then the three scaled standard deviations."""
  image = np.asarray(screenshot, dtype=np.float64)
  if image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < GRID:
    raise ValueError(f"patch_stats needs an [H, W, 3] screenshot with H, W >= {GRID}, got {image.shape}")
  rows, cols = _cell_edges(image.shape[0], GRID), _cell_edges(image.shape[1], GRID)
  out = np.empty((GRID, GRID, 2, 3), np.float64)
  for r in range(GRID):
    for c in range(GRID):
      cell = image[rows[r]:rows[r + 1], cols[c]:cols[c + 1]].reshape(-1, 3)
      out[r, c, 0] = 2.0 * cell.mean(axis=0) / 255.0 - 1.0
      out[r, c, 1] = 2.0 * cell.std(axis=0) / 255.0
  return out.reshape(-1).astype(np.float32)


LATENTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"patch_stats": patch_stats}


def image_latent(name: str, screenshot: np.ndarray) -> np.ndarray:
  """The latent `name` of LATENTS for one screenshot (np.float32 [D])."""
  if name not in LATENTS:
    raise ValueError(f"unknown image latent {name!r}; the latents are {', '.join(LATENTS)}")
  return LATENTS[name](screenshot)
