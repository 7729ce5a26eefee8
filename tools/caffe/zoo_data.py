"""Small synthetic data for a net's data layers (LMDB, image lists, HDF5, window files, mean files), so zoo nets and their
solvers run without their datasets: sources are rewritten to point at files made in a scratch folder."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from ddl.caffe.data.database import LEVELDB, write_db
from ddl.caffe.data.datum import array_datum
from ddl.caffe.formats.blobs import from_array
from ddl.caffe.formats.protofile import write_binary

RECORDS = 24


def guess_image_shape(net_name: str, lp: Any) -> tuple[int, int, int]:
    """(C, H, W) of a data layer's records: MNIST-like nets 1x28x28, CIFAR 3x32x32, else 3 x (crop_size + 29 or 256); three
    mean_value entries always mean three channels."""
    name = net_name.lower()
    crop = int(lp.transform_param.crop_size)
    colour = len(lp.transform_param.mean_value) == 3          # one mean per channel: BGR images whatever the name says
    # "lenet" as a word: GoogleNet's name contains the letters too
    if not colour and (re.search(r"(^|[^a-z])lenet", name) or any(k in name for k in ("mnist", "siamese", "autoencoder"))):
        return (1, 28, 28)
    if "cifar" in name:
        return (3, 32, 32)
    side = crop + 29 if crop else 256
    return (3, side, side)


def sliced_channels(net: Any, lp: Any, shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """The record shape when a Slice splits the data top along channels (a siamese pair stores both images as channels):
    one ``shape`` per slice top, stacked."""
    for other in net.layer:
        if other.type == "Slice" and other.bottom[:1] == lp.top[:1]:
            sp = other.slice_param
            axis = sp.slice_dim if sp.HasField("slice_dim") else sp.axis
            if axis == 1 and len(other.top) > 1:
                return (shape[0] * len(other.top), shape[1], shape[2])
    return shape


def set_input_batch(net: Any, batch: int) -> None:
    """Give the net's declared inputs (``input_shape``, legacy ``input_dim``, ``Input`` layers) ``batch`` as their first
    dimension, in place: a deploy file's own batch (10 crops, 10000 digits) is not what the zoo job measures."""
    if batch <= 0:
        return
    for shape in net.input_shape:
        if len(shape.dim):
            shape.dim[0] = batch
    for i in range(0, len(net.input_dim), 4):                # four dims per legacy input
        net.input_dim[i] = batch
    for lp in net.layer:
        if lp.type == "Input":
            for shape in lp.input_param.shape:
                if len(shape.dim):
                    shape.dim[0] = batch


def _mean(folder: Path, shape: tuple[int, int, int]) -> str:
    path = folder / f"mean_{'x'.join(map(str, shape))}.binaryproto"
    if not path.exists():
        write_binary(path, from_array(np.full((1, *shape), 100.0, np.float32)))
    return str(path)


def _database(folder: Path, shape: tuple[int, int, int], classes: int, rng: np.random.Generator, *, backend: int,
              records: int, tag: str) -> str:
    """A database of ``records`` random images of ``shape`` (LevelDB or LMDB, as the layer reads), written by the
    function behind ``ddl-caffe convert``; ``tag`` keeps a TRAIN and a TEST layer apart (Caffe opens a LevelDB once
    per process)."""
    kind = "leveldb" if backend == LEVELDB else "lmdb"
    path = folder / f"{kind}_{'x'.join(map(str, shape))}_{classes}_{records}{tag}"
    if not path.exists():
        recs = ((f"{i:08d}", array_datum(rng.integers(0, 256, shape, dtype=np.uint8), int(rng.integers(0, classes))))
                for i in range(records))
        write_db(path, recs, backend=backend)
    return str(path)


def _images(folder: Path, shape: tuple[int, int, int], classes: int, rng: np.random.Generator) -> tuple[str, str]:
    from PIL import Image
    root = folder / f"images_{shape[1]}x{shape[2]}"
    listing = root / "list.txt"
    if not listing.exists():
        root.mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(RECORDS):
            Image.fromarray(rng.integers(0, 256, (shape[1], shape[2], 3), dtype=np.uint8)).save(root / f"{i}.png")
            lines.append(f"{i}.png {int(rng.integers(0, classes))}")
        listing.write_text("\n".join(lines) + "\n")
    return str(listing), str(root) + "/"


def _windows(folder: Path, classes: int, rng: np.random.Generator) -> tuple[str, str]:
    listing, root = _images(folder, (3, 120, 160), classes, rng)
    path = folder / "windows.txt"
    if not path.exists():
        parts = []
        for i in range(4):
            rows = [f"{int(rng.integers(1, classes))} 0.8 10 12 90 100", "0 0.1 0 0 60 50", f"{int(rng.integers(1, classes))} 0.6 30 20 150 110"]
            parts.append(f"# {i}\n{i}.png\n3\n120\n160\n{len(rows)}\n" + "\n".join(rows))
        path.write_text("\n".join(parts) + "\n")
    return str(path), root


def _hdf5(folder: Path, tops: list[str], rng: np.random.Generator) -> str:
    import h5py
    path = folder / f"hdf5_{'_'.join(t.replace('/', '_') for t in tops)}.h5"
    listing = path.with_suffix(".txt")
    if not listing.exists():
        with h5py.File(path, "w") as f:
            for t in tops:
                f.create_dataset(t, data=rng.standard_normal((RECORDS, 4)).astype(np.float32) if t != "label"
                                 else rng.integers(0, 2, RECORDS).astype(np.float32))
        listing.write_text(f"{path}\n")
    return str(listing)


def classes_of(net: Any) -> int:
    """The class count a label must stay under: the smallest num_output of the net's InnerProduct layers (or 2)."""
    outs = [lp.inner_product_param.num_output for lp in net.layer if lp.type == "InnerProduct"]
    outs += [lp.convolution_param.num_output for lp in net.layer if lp.type == "Convolution" and "score" in lp.name]
    return max(2, min(outs)) if outs else 2


def point_at_synthetic_data(net: Any, folder: str | Path, *, seed: int = 0, records: int = RECORDS,
                            keep_batch: bool = False) -> list[str]:
    """Rewrite the sources (and mean files) of ``net``'s data layers, in place, to synthetic files in ``folder``:
    ``records`` per database (of the backend the layer reads: LevelDB when it names none, as Caffe), batches cut to
    4 items unless ``keep_batch``.

    Returns:
        One line per rewritten layer, saying what it now reads.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    classes = classes_of(net)
    notes = []
    for lp in net.layer:
        shape = sliced_channels(net, lp, guess_image_shape(net.name, lp))
        if lp.transform_param.HasField("mean_file"):
            lp.transform_param.mean_file = _mean(out, shape)
        if lp.type == "Data":
            backend = lp.data_param.backend
            tag = "".join(f"_{'TRAIN' if r.phase == 0 else 'TEST'}" for r in lp.include if r.HasField("phase"))
            lp.data_param.source = _database(out, shape, classes, rng, backend=backend, records=records, tag=tag)
            if not keep_batch:
                lp.data_param.batch_size = min(lp.data_param.batch_size or 4, 4)
            notes.append(f"{lp.name}: {'LevelDB' if backend == LEVELDB else 'LMDB'} of {records} random {shape} images")
        elif lp.type == "ImageData":
            src, root = _images(out, shape, classes, rng)
            lp.image_data_param.source, lp.image_data_param.root_folder = src, root
            lp.image_data_param.batch_size = min(lp.image_data_param.batch_size or 4, 4)
            notes.append(f"{lp.name}: {RECORDS} random PNG images")
        elif lp.type == "WindowData":
            src, root = _windows(out, classes, rng)
            lp.window_data_param.source, lp.window_data_param.root_folder = src, root
            lp.window_data_param.batch_size = min(lp.window_data_param.batch_size or 8, 8)
            if lp.transform_param.HasField("mean_file"):
                side = max(int(lp.transform_param.crop_size), 1)
                lp.transform_param.mean_file = _mean(out, (3, side, side))
            notes.append(f"{lp.name}: a window file over 4 random images")
        elif lp.type == "HDF5Data":
            lp.hdf5_data_param.source = _hdf5(out, list(lp.top), rng)
            lp.hdf5_data_param.batch_size = min(lp.hdf5_data_param.batch_size or 4, 4)
            notes.append(f"{lp.name}: HDF5 rows")
    return notes


def shrink_solver(sp: Any, *, iters: int, prefix: str) -> None:
    """A few iterations of a real solver: max_iter, test and snapshot intervals scaled down, snapshots in scratch."""
    sp.max_iter = iters
    if len(sp.test_iter):
        for i in range(len(sp.test_iter)):
            sp.test_iter[i] = 1
        sp.test_interval = iters
    sp.snapshot = iters if sp.snapshot else 0
    sp.snapshot_prefix = prefix
    sp.display = max(1, math.ceil(iters / 2))
    if sp.lr_policy in ("step", "sigmoid"):
        sp.stepsize = max(1, iters // 2)
    if len(sp.stepvalue):
        del sp.stepvalue[:]
        sp.stepvalue.append(max(1, iters // 2))
