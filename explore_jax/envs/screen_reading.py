"""Reading a GUI world's screen: line-level OCR boxes and an image latent that moves when the screen changes.

Both run inside actor processes (no jax), on the uint8 [H, W, 3] screenshots of the GUI worlds (MiniWoB-v0).

- `ocr_boxes(screenshot)`: tesseract (Debian's `tesseract-ocr`, through pytesseract's `image_to_data`) reads
  the screenshot; its words are grouped by (block, paragraph, line) into one `OcrBox` per line, the line's
  words joined by one space, empty lines dropped, boxes in screenshot pixels. Small screenshots read badly, so
  the image is scaled up by `upscale` (bicubic) before OCR and the boxes are mapped back. The settings
  (upscale, page segmentation mode `psm`) are options; their defaults are not yet measured on this project's
  own screenshots (see benchmarks/README.md once they are).
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
from typing import Callable

import numpy as np
from PIL import Image

GRID = 8


@dataclasses.dataclass(frozen=True)
class OcrBox:
  """One line of text read from a screenshot: its box in screenshot pixels (x1, y1 exclusive) and text."""

  x0: int
  y0: int
  x1: int
  y1: int
  text: str

  def as_list(self) -> list:
    return [self.x0, self.y0, self.x1, self.y1, self.text]


def ocr_boxes(screenshot: np.ndarray, *, upscale: int = 2, psm: int = 3, lang: str = "eng") -> list[OcrBox]:
  """Line-level OCR boxes of a uint8 [H, W, 3] screenshot, in reading order (tesseract's)."""
  import pytesseract  # only where OCR runs

  if upscale < 1:
    raise ValueError(f"upscale must be at least 1, got {upscale}")
  height, width = screenshot.shape[:2]
  with Image.fromarray(np.ascontiguousarray(screenshot, dtype=np.uint8)) as image:
    scaled = image.resize((width * upscale, height * upscale), Image.Resampling.BICUBIC) if upscale > 1 else image
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
    right = max(data["left"][i] + data["width"][i] for i in indices)
    bottom = max(data["top"][i] + data["height"][i] for i in indices)
    text = " ".join(data["text"][i].strip() for i in indices)
    boxes.append(OcrBox(left // upscale, top // upscale, min(width, -(-right // upscale)),
                        min(height, -(-bottom // upscale)), text))
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
