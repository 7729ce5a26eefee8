"""ImageData, WindowData, MemoryData, HDF5Output and Python layers: Caffe's reading rules, per-rank shards, pycaffe's protocol."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
h5py = pytest.importorskip("h5py")

from PIL import Image  # noqa: E402

from ddl.caffe.data.images import read_image, resize_linear  # noqa: E402
from ddl.caffe.formats import protofile, schema  # noqa: E402
from ddl.caffe.layers.base import LayerError  # noqa: E402
from ddl.caffe.layers.check import forward, single_layer  # noqa: E402
from ddl.caffe.net.net import Net  # noqa: E402

RNG = np.random.default_rng(2)


def _images(tmp: Path, n: int, size: tuple[int, int] = (6, 5)) -> list[np.ndarray]:
    (tmp / "img").mkdir()
    arrays = []
    lines = []
    for i in range(n):
        a = RNG.integers(0, 256, (*size, 3), dtype=np.uint8)
        Image.fromarray(a).save(tmp / "img" / f"{i}.png")
        arrays.append(a)
        lines.append(f"{i}.png {i % 3}")
    (tmp / "list.txt").write_text("\n".join(lines) + "\n")
    return arrays


def test_image_data_reads_bgr_resizes_and_shards(tmp_path: Path) -> None:
    arrays = _images(tmp_path, 5)
    body = (f'name: "d" type: "ImageData" top: "data" top: "label" image_data_param {{ source: "{tmp_path / "list.txt"}" '
            f'root_folder: "{tmp_path / "img"}/" batch_size: 2 new_height: 4 new_width: 3 }} transform_param {{ scale: 0.5 mean_value: 10 }}')
    la = single_layer(body, [], phase=schema.TRAIN)
    assert la.top_shapes() == [(2, 3, 4, 3), (2,)]            # type: ignore[attr-defined]
    x, y = forward(la, [])
    bgr = [a[:, :, ::-1].transpose(2, 0, 1).astype(np.float32) for a in arrays]
    np.testing.assert_allclose(x[1], (resize_linear(bgr[1], 4, 3) - 10) * 0.5)
    np.testing.assert_array_equal(y, [0, 1])
    forward(la, [])
    x, y = forward(la, [])                                    # item 4, then the list wraps to item 0
    np.testing.assert_array_equal(y, [1, 0])
    np.testing.assert_allclose(x[1], (resize_linear(bgr[0], 4, 3) - 10) * 0.5)
    rank1 = single_layer(body, [], phase=schema.TRAIN, double=False)
    rank1.rank, rank1.size = 1, 2                             # type: ignore[attr-defined]
    rank1.setup([])
    assert forward(rank1, [])[1].tolist() == [1, 0]           # lines 1 and 3 (labels 1, 0)
    gray = single_layer(body.replace("batch_size: 2", "batch_size: 1 is_color: false"), [])
    assert gray.top_shapes()[0] == (1, 1, 4, 3)               # type: ignore[attr-defined]
    with pytest.raises(LayerError, match="does not exist"):
        single_layer(body.replace("list.txt", "nope.txt"), [])


def test_resize_matches_opencv_linear_rule() -> None:
    img = RNG.integers(0, 256, (1, 4, 6)).astype(np.float32)
    out = resize_linear(img, 2, 3)
    # cv::resize INTER_LINEAR halving: each output pixel averages a 2x2 block (src = 2 dst + 0.5).
    ref = np.round(img[0].reshape(2, 2, 3, 2).mean(axis=(1, 3)))
    np.testing.assert_allclose(out[0], ref)


def test_window_data_warps_windows_and_mixes_fg_and_bg(tmp_path: Path) -> None:
    arrays = _images(tmp_path, 2, size=(20, 24))
    wf = tmp_path / "windows.txt"
    wf.write_text("# 0\n0.png\n3\n20\n24\n3\n2 0.9 2 3 13 14\n1 0.2 0 0 9 9\n3 0.3 5 5 20 15\n"
                  "# 1\n1.png\n3\n20\n24\n1\n0 0.1 1 1 22 18\n")
    body = (f'name: "w" type: "WindowData" top: "data" top: "label" window_data_param {{ source: "{wf}" root_folder: "{tmp_path / "img"}/" '
            f'batch_size: 8 fg_fraction: 0.25 fg_threshold: 0.5 bg_threshold: 0.5 }} transform_param {{ crop_size: 6 mean_value: 100 }}')
    la = single_layer(body, [], phase=schema.TRAIN)
    x, y = forward(la, [])
    assert x.shape == (8, 3, 6, 6)
    assert (y[:6] == 0).all() and (y[6:] == 2).all()          # 8 * 0.25 = 2 foreground windows, last
    bgr = arrays[0][:, :, ::-1].transpose(2, 0, 1).astype(np.float32)
    crop = resize_linear(bgr[:, 3:15, 2:14], 6, 6) - 100      # window 2 3 13 14 (x1 y1 x2 y2), warped
    np.testing.assert_allclose(x[6], crop)
    np.testing.assert_allclose(x[7], crop)
    ctx = single_layer(body.replace("bg_threshold: 0.5", "bg_threshold: 0.5 context_pad: 1 crop_mode: \"square\""), [], phase=schema.TRAIN)
    xs, _ = forward(ctx, [])
    assert xs.shape == (8, 3, 6, 6) and np.isfinite(xs).all()
    with pytest.raises(LayerError, match="crop_size must be given"):
        single_layer(body.replace("crop_size: 6 ", ""), [])


def test_memory_data_batches_what_python_hands_over() -> None:
    la = single_layer('name: "m" type: "MemoryData" top: "data" top: "label" memory_data_param { batch_size: 2 channels: 1 height: 2 width: 2 }',
                      [], phase=schema.TRAIN)
    with pytest.raises(LayerError, match="no data yet"):
        forward(la, [])
    x, lab = np.arange(24, dtype=np.float32).reshape(6, 1, 2, 2), np.arange(6, dtype=np.float32)
    la.set_input_arrays(x, lab)                               # type: ignore[attr-defined]
    got = [forward(la, [])[1].tolist() for _ in range(4)]
    assert got == [[0, 1], [2, 3], [4, 5], [0, 1]]
    with pytest.raises(LayerError, match="multiple of batch_size"):
        la.set_input_arrays(x[:5], lab[:5])                   # type: ignore[attr-defined]
    la.rank, la.size = 1, 2                                   # type: ignore[attr-defined]
    la.set_input_arrays(x[:4], lab[:4])                       # type: ignore[attr-defined]
    assert forward(la, [])[1].tolist() == [1, 3]


def test_hdf5_output_writes_and_appends(tmp_path: Path) -> None:
    out = tmp_path / "out.h5"
    la = single_layer(f'name: "o" type: "HDF5Output" bottom: "d" bottom: "l" hdf5_output_param {{ file_name: "{out}" }}', [(2, 3), (2,)])
    forward(la, [np.ones((2, 3)), np.zeros(2)])
    forward(la, [np.full((2, 3), 2.0), np.ones(2)])
    la.file.close()                                           # type: ignore[attr-defined]
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["data"][:], [[1] * 3] * 2 + [[2] * 3] * 2)
        np.testing.assert_array_equal(f["label"][:], [0, 0, 1, 1])


PY_LAYER = '''
import caffe
import numpy as np


class Scaler(caffe.Layer):
    """y = k x (k from param_str); a pycaffe-style layer with setup/reshape/forward/backward."""

    def setup(self, bottom, top):
        self.k = float(self.param_str or 1)
        if len(bottom) != 1:
            raise Exception("one bottom")

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.k * bottom[0].data + (self.phase == caffe.TRAIN)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = self.k * top[0].diff


class Source(caffe.Layer):
    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape(2, 3)

    def forward(self, bottom, top):
        top[0].data[...] = np.arange(6).reshape(2, 3)
'''


def test_python_layers_run_through_pycaffes_protocol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_layers.py").write_text(PY_LAYER)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = ('layer { name: "src" type: "Python" top: "x" python_param { module: "my_layers" layer: "Source" } }\n'
            'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "h" inner_product_param { num_output: 3 weight_filler { type: "gaussian" } } }\n'
            'layer { name: "py" type: "Python" bottom: "h" top: "y" python_param { module: "my_layers" layer: "Scaler" param_str: "3" } }\n'
            'layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "x" top: "l" }\n')
    net = Net(protofile.parse_text(text, schema.NetParameter()), schema.TEST, quiet=True)
    assert net.shapes["y"] == (2, 3)
    loss, blobs = net.forward()
    h = blobs["h"].detach().numpy()
    np.testing.assert_allclose(blobs["y"].detach().numpy(), 3 * h, rtol=1e-6)
    loss.backward()
    w = net.layer_by_name("ip").blobs[0]                      # type: ignore[union-attr]
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    ref = (3 * (3 * h - x) / 2).T @ x                         # d/dW of the loss through the Python layer's backward
    np.testing.assert_allclose(w.grad.numpy(), ref, rtol=1e-4)
    assert "caffe" in sys.modules
    with pytest.raises(LayerError, match="python_param.module 'nowhere' cannot be imported"):
        Net(protofile.parse_text(text.replace('"my_layers" layer: "Source"', '"nowhere" layer: "Source"'), schema.NetParameter()), schema.TEST)
    with pytest.raises(LayerError, match="has no class 'Nope'"):
        Net(protofile.parse_text(text.replace('layer: "Source"', 'layer: "Nope"'), schema.NetParameter()), schema.TEST)


def test_read_image_errors_are_clear(tmp_path: Path) -> None:
    bad = tmp_path / "x.jpg"
    bad.write_bytes(b"not an image")
    with pytest.raises(protofile.CaffeFormatError, match="cannot read image"):
        read_image(bad)
