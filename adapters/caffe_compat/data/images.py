"""Reading images as Caffe does with OpenCV: BGR (or gray) (C, H, W) float32, resized like cv::resize INTER_LINEAR."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ddl.caffe.formats.errors import CaffeFormatError


def resize_linear(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """cv::resize(INTER_LINEAR) of a (C, H, W) 8-bit image: half-pixel centres, no antialiasing, rounded."""
    if img.shape[1:] == (height, width):
        return img
    t = torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32))[None]
    out = F.interpolate(t, size=(height, width), mode="bilinear", align_corners=False, antialias=False)[0]
    return out.round_().clamp_(0, 255).numpy()


def read_image(path: str | Path, *, height: int = 0, width: int = 0, color: bool = True) -> np.ndarray:
    """The image at ``path`` as (3, H, W) BGR or (1, H, W) gray float32, resized when height and width are given.

    Raises:
        CaffeFormatError: the file is missing or not an image.
    """
    from PIL import Image
    try:
        with Image.open(path) as im:
            arr = np.asarray(im.convert("RGB" if color else "L"))
    except (OSError, ValueError) as e:
        raise CaffeFormatError(f"cannot read image {path}: {e}") from None
    chw = arr[:, :, ::-1].transpose(2, 0, 1) if color else arr[None]
    chw = np.ascontiguousarray(chw, dtype=np.float32)
    if height > 0 and width > 0:
        chw = resize_linear(chw, height, width)
    return chw
