"""Upsampling layers of the forks: Upsample (YOLOv3's nearest, or SegNet's unpooling by a max-pool mask) and Interp (DeepLab/PSPNet bilinear)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ddl.caffe.layers.base import Layer


class Upsample(Layer):
    """One bottom: nearest-neighbour by ``scale`` (YOLOv3 forks). Two bottoms (data, max-pool mask):
    SegNet's unpooling, each value written where the mask says, zeros elsewhere."""

    type = "Upsample"
    params = ("upsample_param",)
    max_bottoms = 2

    def allow_force_backward(self, i: int) -> bool:
        return i == 0

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.upsample_param
        if len(shapes[0]) != 4:
            raise self.error(f"needs a 4-D bottom, got {list(shapes[0])}")
        sh = p.scale_h if p.HasField("scale_h") else p.scale
        sw = p.scale_w if p.HasField("scale_w") else p.scale
        if sh < 1 or sw < 1:
            raise self.error("scale must be at least 1")
        h, w = shapes[0][2], shapes[0][3]
        oh = p.upsample_h if p.HasField("upsample_h") else h * sh - int(p.pad_out_h)
        ow = p.upsample_w if p.HasField("upsample_w") else w * sw - int(p.pad_out_w)
        self.out = (int(oh), int(ow))
        self.scale = (int(sh), int(sw))
        if len(shapes) == 2 and shapes[1] != shapes[0]:
            raise self.error(f"the mask must have the data's shape {list(shapes[0])}, got {list(shapes[1])}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        if len(bottoms) == 1:
            return [F.interpolate(x, size=self.out, mode="nearest")]
        n, c = x.shape[:2]
        idx = bottoms[1].detach().to(torch.int64).reshape(n, c, -1)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.out[0] * self.out[1]):
            raise self.error(f"mask indices must lie in [0, {self.out[0] * self.out[1]})")
        top = x.new_zeros(n, c, self.out[0] * self.out[1])
        return [top.scatter(2, idx, x.reshape(n, c, -1)).reshape(n, c, *self.out)]


class Interp(Layer):
    """Bilinear resizing with aligned corners, to height/width, zoom_factor or shrink_factor (or bottom 1's size)."""

    type = "Interp"
    params = ("interp_param",)
    max_bottoms = 2

    def allow_force_backward(self, i: int) -> bool:
        return i == 0

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.interp_param
        if len(shapes[0]) != 4:
            raise self.error(f"needs a 4-D bottom, got {list(shapes[0])}")
        if p.pad_beg > 0 or p.pad_end > 0:
            raise self.error("positive pad_beg/pad_end (padding) are not supported; non-positive ones crop")
        self.crop = (-p.pad_beg, -p.pad_end)
        h = shapes[0][2] + p.pad_beg + p.pad_end
        w = shapes[0][3] + p.pad_beg + p.pad_end
        zoom, shrink = p.HasField("zoom_factor"), p.HasField("shrink_factor")
        if (zoom and p.zoom_factor < 1) or (shrink and p.shrink_factor < 1):
            raise self.error("zoom_factor and shrink_factor must be at least 1")
        if shrink and not zoom:
            oh, ow = (h - 1) // p.shrink_factor + 1, (w - 1) // p.shrink_factor + 1
        elif zoom and not shrink:
            oh, ow = h + (h - 1) * (p.zoom_factor - 1), w + (w - 1) * (p.zoom_factor - 1)
        elif p.HasField("height") and p.HasField("width"):
            oh, ow = p.height, p.width
        elif zoom and shrink:
            oh, ow = (h - 1) // p.shrink_factor + 1, (w - 1) // p.shrink_factor + 1
            oh, ow = oh + (oh - 1) * (p.zoom_factor - 1), ow + (ow - 1) * (p.zoom_factor - 1)
        elif len(shapes) == 2:
            oh, ow = shapes[1][2], shapes[1][3]
        else:
            raise self.error("give height and width, zoom_factor and/or shrink_factor, or a second bottom to match")
        if min(oh, ow, h, w) <= 0:
            raise self.error(f"output {oh}x{ow} from input {h}x{w} is empty")
        self.out = (int(oh), int(ow))

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x = bottoms[0]
        b, e = self.crop
        if b or e:
            x = x[:, :, b:x.shape[2] - e, b:x.shape[3] - e]
        return [F.interpolate(x, size=self.out, mode="bilinear", align_corners=True)]
