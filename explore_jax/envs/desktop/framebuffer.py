"""Xvfb's screen as a numpy array: the memory-mapped XWD file that `Xvfb -fbdir DIR` draws into.

`DIR/Xvfb_screen0` is an XWD image (X11's XWDFile.h) that *is* the framebuffer: the server renders into the
mapping, so reading it is a copy, not a screenshot request. Its layout is read from its own header, never
assumed: 25 CARD32 fields (big-endian, as xwd writes them; the other order is accepted too), the window name
up to `header_size`, `ncolors` XWDColor entries of 12 bytes, then `pixmap_height` rows of `bytes_per_line`
bytes. Only what a 24-bit TrueColor Xvfb screen gives is supported: ZPixmap, 32 bits per pixel, 8-bit
byte-aligned channel masks (Xvfb's 0xff0000 / 0xff00 / 0xff in LSBFirst order are B, G, R, X bytes).
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

XWD_FILE_VERSION = 7
ZPIXMAP = 2
TRUE_COLOR = 4
XWD_COLOR_BYTES = 12  # pixel (CARD32), red, green, blue (CARD16 each), flags, pad
LSB_FIRST, MSB_FIRST = 0, 1
XWD_FIELDS = (
    "header_size", "file_version", "pixmap_format", "pixmap_depth", "pixmap_width", "pixmap_height", "xoffset",
    "byte_order", "bitmap_unit", "bitmap_bit_order", "bitmap_pad", "bits_per_pixel", "bytes_per_line",
    "visual_class", "red_mask", "green_mask", "blue_mask", "bits_per_rgb", "colormap_entries", "ncolors",
    "window_width", "window_height", "window_x", "window_y", "window_bdrwidth",
)
_HEADER_BYTES = 4 * len(XWD_FIELDS)


@dataclasses.dataclass(frozen=True)
class XwdHeader:
  """The fields of an XWD file header (XWDFile.h's XWDFileHeader)."""

  header_size: int
  file_version: int
  pixmap_format: int
  pixmap_depth: int
  pixmap_width: int
  pixmap_height: int
  xoffset: int
  byte_order: int
  bitmap_unit: int
  bitmap_bit_order: int
  bitmap_pad: int
  bits_per_pixel: int
  bytes_per_line: int
  visual_class: int
  red_mask: int
  green_mask: int
  blue_mask: int
  bits_per_rgb: int
  colormap_entries: int
  ncolors: int
  window_width: int
  window_height: int
  window_x: int
  window_y: int
  window_bdrwidth: int

  @property
  def pixels_offset(self) -> int:
    """Where the pixel rows start: after the header (with the window name) and the colour map."""
    return self.header_size + XWD_COLOR_BYTES * self.ncolors

  @property
  def size(self) -> int:
    """The file's length in bytes."""
    return self.pixels_offset + self.bytes_per_line * self.pixmap_height

  def rgb_bytes(self) -> tuple[int, int, int]:
    """The byte index, inside one 32-bit pixel, of red, green and blue."""
    if (self.pixmap_format, self.bits_per_pixel, self.visual_class) != (ZPIXMAP, 32, TRUE_COLOR):
      raise ValueError(f"only 32-bit TrueColor ZPixmap screens are read, got format {self.pixmap_format}, "
                       f"{self.bits_per_pixel} bits per pixel, visual class {self.visual_class}")
    if self.byte_order not in (LSB_FIRST, MSB_FIRST):
      raise ValueError(f"unknown XWD byte order {self.byte_order}")
    indices = []
    for mask in (self.red_mask, self.green_mask, self.blue_mask):
      shift = next((s for s in (0, 8, 16, 24) if mask == 0xFF << s), None)
      if shift is None:
        raise ValueError(f"channel mask {mask:#x} is not one byte")
      indices.append(shift // 8 if self.byte_order == LSB_FIRST else 3 - shift // 8)
    return tuple(indices)


def parse_header(data: bytes) -> XwdHeader:
  """The header at the start of an XWD file; ValueError when `data` is not one."""
  if len(data) < _HEADER_BYTES:
    raise ValueError(f"an XWD header has {_HEADER_BYTES} bytes, got {len(data)}")
  for order in (">", "<"):  # xwd and Xvfb write big-endian; a file in this machine's order would be read too
    header = XwdHeader(*struct.unpack(f"{order}{len(XWD_FIELDS)}I", data[:_HEADER_BYTES]))
    if header.file_version == XWD_FILE_VERSION and _HEADER_BYTES <= header.header_size < 1 << 16:
      return header
  raise ValueError(f"not an XWD file of version {XWD_FILE_VERSION}")


class Framebuffer:
  """The pixels of one `Xvfb -fbdir` screen file, mapped read-only; `read()` copies them out as RGB."""

  def __init__(self, path: str):
    with open(path, "rb") as f:
      self.header = parse_header(f.read(_HEADER_BYTES))
    header = self.header
    self.rgb = list(header.rgb_bytes())
    if header.bytes_per_line < 4 * header.pixmap_width:
      raise ValueError(f"{header.bytes_per_line} bytes per line cannot hold {header.pixmap_width} pixels")
    mapped = np.memmap(path, np.uint8, mode="r", offset=header.pixels_offset,
                       shape=(header.pixmap_height, header.bytes_per_line))
    self.width, self.height = header.pixmap_width, header.pixmap_height
    self._pixels = mapped[:, : 4 * self.width].reshape(self.height, self.width, 4)

  def read(self) -> np.ndarray:
    """The screen now, as a fresh uint8 [height, width, 3] RGB array."""
    screen = np.empty((self.height, self.width, 3), np.uint8)
    for channel, byte in enumerate(self.rgb):  # a strided copy per channel: 6x faster than fancy indexing
      screen[..., channel] = self._pixels[..., byte]
    return screen

  def close(self) -> None:
    self._pixels = None  # the mapping goes with its last reference
