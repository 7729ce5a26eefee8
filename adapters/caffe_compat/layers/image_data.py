"""ImageData (a list of image files and labels), dealt over the ranks in TRAIN, and WindowData (R-CNN's window file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ddl.caffe.data.dealing import StreamDeal
from ddl.caffe.data.images import read_image, resize_linear
from ddl.caffe.data.transform import Transformer
from ddl.caffe.formats import schema
from ddl.caffe.formats.blobs import to_array
from ddl.caffe.formats.protofile import read_binary
from ddl.caffe.layers.inputs import DataLayer


def _deprecated_transform(layer: DataLayer, p: object) -> None:
    if any(p.HasField(f) for f in ("scale", "mean_file", "crop_size", "mirror")):      # type: ignore[attr-defined]
        raise layer.error("the deprecated scale/mean_file/crop_size/mirror here are not read; move them to "
                          "transform_param (or run 'ddl-caffe upgrade', which does)")


class ImageData(DataLayer):
    """``source`` lists '<path> <label>' lines (paths under ``root_folder``); images decoded BGR, resized, transformed."""

    type = "ImageData"
    params = ("image_data_param", "transform_param")
    max_tops = 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.image_data_param
        _deprecated_transform(self, p)
        if (p.new_height > 0) != (p.new_width > 0):
            raise self.error("give both new_height and new_width, or neither")
        src = Path(p.source)
        if not src.is_file():
            raise self.error(f"image_data_param.source {src} does not exist (it lists '<image path> <label>' lines)")
        lines: list[tuple[str, int]] = []
        for k, ln in enumerate(src.read_text().splitlines(), 1):
            if not ln.strip():
                continue
            name, _, label = ln.rstrip().rpartition(" ")
            if not name or not label.lstrip("-").isdigit():
                raise self.error(f"{src}:{k}: expected '<path> <integer label>', got {ln!r}")
            lines.append((p.root_folder + name, int(label)))
        if not lines:
            raise self.error(f"{src} lists no images")
        if p.batch_size <= 0:
            raise self.error("image_data_param.batch_size must be positive")
        self.lines, self.p, self.batch = lines, p, int(p.batch_size)
        self.tf = Transformer(self.lp.transform_param, self.phase, self.gen, where=f"layer '{self.name}'")
        # Drawn from the net's generator, which starts alike on every rank: the ranks share the epochs' order.
        seed = int(torch.randint(1 << 62, (1,), generator=self.gen)) if p.shuffle else None
        # Caffe skips a random number of lines below rand_skip once, at the start.
        skip = int(torch.randint(int(p.rand_skip), (1,), generator=self.gen)) if p.rand_skip else 0
        shard = self.phase == schema.TRAIN and self.size > 1
        self.deal = StreamDeal(len(lines), rank=self.rank if shard else 0, size=self.size if shard else 1,
                               seed=seed, skip=skip)
        self.shape = (self.batch, *self.tf.out_shape(*self._read(self.deal.order(0)[skip % len(lines)]).shape))

    def _read(self, i: int) -> np.ndarray:
        path = self.lines[i][0]
        return read_image(path, height=self.p.new_height, width=self.p.new_width, color=self.p.is_color)

    def top_shapes(self) -> list[tuple[int, ...]]:
        return [self.shape, (self.batch,)][: len(self.top)]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        xs = np.empty(self.shape, np.float32)
        ys = np.empty(self.batch, np.float32)
        for b in range(self.batch):
            i = self.deal.next()
            x = self.tf(self._read(i))
            if x.shape != self.shape[1:]:
                raise self.error(f"{self.lines[i][0]} gives shape {list(x.shape)} after the transform, the batch "
                                 f"needs {list(self.shape[1:])}; set new_height/new_width or crop_size")
            xs[b], ys[b] = x, self.lines[i][1]
        return [torch.from_numpy(xs), torch.from_numpy(ys)][: len(self.top)]


class WindowData(DataLayer):
    """R-CNN windows: '# i / path / channels / height / width / n / n lines of label overlap x1 y1 x2 y2'; each batch
    draws fg_fraction foreground (overlap >= fg_threshold) and the rest background windows, warped to crop_size."""

    type = "WindowData"
    params = ("window_data_param", "transform_param")
    max_tops = 2

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.window_data_param
        _deprecated_transform(self, p)
        tp = self.lp.transform_param
        self.crop = int(tp.crop_size)
        if self.crop <= 0:
            raise self.error("transform_param.crop_size must be given (the size windows are warped to)")
        if p.crop_mode not in ("warp", "square"):
            raise self.error(f"crop_mode must be 'warp' or 'square', got '{p.crop_mode}'")
        if p.context_pad * 2 >= self.crop:
            raise self.error(f"context_pad {p.context_pad} leaves nothing of crop_size {self.crop}")
        self.p, self.batch = p, int(p.batch_size)
        if self.batch <= 0:
            raise self.error("window_data_param.batch_size must be positive")
        self.images: list[str] = []
        self.fg: list[tuple[int, ...]] = []
        self.bg: list[tuple[int, ...]] = []
        self._parse(Path(p.source))
        if not self.fg and not self.bg:
            raise self.error(f"{p.source} holds no window above fg_threshold or below bg_threshold")
        self.scale, self.mirror = tp.scale, tp.mirror
        self.mean_values = np.asarray(list(tp.mean_value), np.float32)
        self.mean: np.ndarray | None = None
        if tp.HasField("mean_file"):
            m = to_array(read_binary(tp.mean_file, schema.BlobProto()), where=tp.mean_file)
            mean: np.ndarray = m.reshape(tuple(int(d) for d in m.shape)[-3:])
            if mean.shape[-1] != mean.shape[-2] or mean.shape[-1] < self.crop:
                raise self.error(f"mean_file shape {list(mean.shape)} must be square and at least crop_size {self.crop}")
            self.mean = mean
        self.channels = 3
        self.cache: dict[int, np.ndarray] = {}

    def _parse(self, src: Path) -> None:
        if not src.is_file():
            raise self.error(f"window_data_param.source {src} does not exist")
        toks = src.read_text().split()
        i = 0
        try:
            while i < len(toks):
                if toks[i] != "#":
                    raise self.error(f"{src}: expected '#' before image {len(self.images)}, got {toks[i]!r}")
                path = self.p.root_folder + toks[i + 2]
                n = int(toks[i + 6])
                i += 7
                img = len(self.images)
                self.images.append(path)
                for _ in range(n):
                    label, overlap = int(toks[i]), float(toks[i + 1])
                    x1, y1, x2, y2 = (int(float(v)) for v in toks[i + 2:i + 6])
                    i += 6
                    if overlap >= self.p.fg_threshold:
                        if label <= 0:
                            raise self.error(f"{src}: a foreground window of {path} has label {label} (must be > 0)")
                        self.fg.append((img, label, x1, y1, x2, y2))
                    elif overlap < self.p.bg_threshold:
                        self.bg.append((img, 0, x1, y1, x2, y2))
        except (IndexError, ValueError):
            raise self.error(f"{src}: truncated or malformed window file near token {i}") from None

    def top_shapes(self) -> list[tuple[int, ...]]:
        return [(self.batch, self.channels, self.crop, self.crop), (self.batch,)][: len(self.top)]

    def _rand(self) -> int:
        return int(torch.randint(1 << 31, (1,), generator=self.gen))

    def _image(self, i: int) -> np.ndarray:
        if i in self.cache:
            return self.cache[i]
        img = read_image(self.images[i])
        if self.p.cache_images:
            self.cache[i] = img
        return img

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        crop, pad_ctx = self.crop, self.p.context_pad
        xs = np.zeros((self.batch, self.channels, crop, crop), np.float32)
        ys = np.zeros(self.batch, np.float32)
        n_fg = int(self.batch * self.p.fg_fraction)
        item = 0
        for is_fg, count in ((False, self.batch - n_fg), (True, n_fg)):
            pool = self.fg if is_fg else self.bg
            if count and not pool:
                raise self.error(f"the batch needs {'foreground' if is_fg else 'background'} windows and the file has none")
            for _ in range(count):
                w = pool[self._rand() % len(pool)]
                mirror = self.mirror and self._rand() % 2 == 1
                xs[item] = self._window(self._image(w[0]), w[2:], crop, pad_ctx, mirror)
                ys[item] = w[1]
                item += 1
        return [torch.from_numpy(xs), torch.from_numpy(ys)][: len(self.top)]

    def _window(self, img: np.ndarray, box: tuple[int, ...], crop: int, context: int, mirror: bool) -> np.ndarray:
        # Caffe's WindowDataLayer::load_batch: context padding, optional square, clip, warp, pad, mirror, mean, scale.
        x1, y1, x2, y2 = box
        h_img, w_img = img.shape[1], img.shape[2]
        pad_w = pad_h = 0
        if context > 0 or self.p.crop_mode == "square":
            ctx_scale = crop / (crop - 2.0 * context)
            half_h, half_w = (y2 - y1 + 1) / 2.0, (x2 - x1 + 1) / 2.0
            cx, cy = x1 + half_w, y1 + half_h
            if self.p.crop_mode == "square":
                half_h = half_w = max(half_h, half_w)
            x1, x2 = int(round(cx - half_w * ctx_scale)), int(round(cx + half_w * ctx_scale))
            y1, y2 = int(round(cy - half_h * ctx_scale)), int(round(cy + half_h * ctx_scale))
            uh, uw = y2 - y1 + 1, x2 - x1 + 1
            px1, py1 = max(0, -x1), max(0, -y1)
            px2, py2 = max(0, x2 - w_img + 1), max(0, y2 - h_img + 1)
            x1, x2 = x1 + px1, x2 - px2
            y1, y2 = y1 + py1, y2 - py2
            sx, sy = crop / uw, crop / uh
            cw, ch = int(round((x2 - x1 + 1) * sx)), int(round((y2 - y1 + 1) * sy))
            px1, px2 = int(round(px1 * sx)), int(round(px2 * sx))
            py1 = int(round(py1 * sy))
            pad_h = py1
            pad_w = px2 if mirror else px1
            ch = min(ch, crop - py1)
            cw = min(cw, crop - pad_w)
        else:
            cw = ch = crop
        x1, y1 = max(0, x1), max(0, y1)
        x2, y2 = min(w_img - 1, x2), min(h_img - 1, y2)
        if x2 < x1 or y2 < y1 or cw <= 0 or ch <= 0:
            raise self.error(f"window {list(box)} lies outside its {w_img}x{h_img} image")
        patch = resize_linear(img[:, y1:y2 + 1, x1:x2 + 1], ch, cw)
        if mirror:
            patch = patch[:, :, ::-1]
        out = np.zeros((self.channels, crop, crop), np.float32)
        region = (slice(None), slice(pad_h, pad_h + ch), slice(pad_w, pad_w + cw))
        if self.mean is not None:
            off = (self.mean.shape[1] - crop) // 2
            mean = self.mean[:, off + pad_h:off + pad_h + ch, off + pad_w:off + pad_w + cw]
            out[region] = (patch - mean) * self.scale
        elif self.mean_values.size:
            mv = self.mean_values if self.mean_values.size == self.channels else np.repeat(self.mean_values[:1], self.channels)
            out[region] = (patch - mv[:, None, None]) * self.scale
        else:
            out[region] = patch * self.scale
        return out
