""".caffemodel and .solverstate at disk speed: blobs streamed from tensors into protobuf's wire format and read back as
views of a memory map (no Python lists); the HDF5 variants (``.caffemodel.h5``, ``.solverstate.h5``) in Caffe's layout."""

from __future__ import annotations

import contextlib
import mmap
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from ddl.base.atomic_write import atomic_path
from ddl.caffe.formats.errors import CaffeFormatError
from ddl.caffe.formats.whole_file import replacing, swap_in

LEN, VARINT, I32, I64 = 2, 0, 5, 1


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint (two's complement for negatives, as int64)."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint((number << 3) | wire)


def _array(t: torch.Tensor | np.ndarray) -> np.ndarray:
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t
    return np.ascontiguousarray(a, dtype="<f4")           # a view when already float32 and contiguous


@dataclass
class BlobBytes:
    """One BlobProto as wire-format pieces: shape header, then data (and diff) written straight from arrays."""

    shape: tuple[int, ...]
    data: np.ndarray
    diff: np.ndarray | None = None
    pieces: list[bytes | memoryview] = field(default_factory=list)

    def __post_init__(self) -> None:
        dims = b"".join(varint(d) for d in self.shape)
        shape_msg = tag(1, LEN) + varint(len(dims)) + dims      # BlobShape.dim, packed
        for number, arr in ((5, self.data), (6, self.diff)):
            if arr is not None:
                self.pieces += [tag(number, LEN) + varint(arr.nbytes), memoryview(arr.data).cast("B")]
        self.pieces.append(tag(7, LEN) + varint(len(shape_msg)) + shape_msg)

    @property
    def size(self) -> int:
        return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in self.pieces)


def _message_size(head: bytes, blob_field: int, blobs: list[BlobBytes]) -> int:
    """Bytes of one length-delimited message's body: its header and its blob fields."""
    return len(head) + sum(len(tag(blob_field, LEN)) + len(varint(b.size)) + b.size for b in blobs)


def _write_message(f: BinaryIO, number: int, head: bytes, blob_field: int, blobs: list[BlobBytes]) -> None:
    f.write(tag(number, LEN) + varint(_message_size(head, blob_field, blobs)) + head)
    for b in blobs:
        f.write(tag(blob_field, LEN) + varint(b.size))
        for piece in b.pieces:
            f.write(piece)


def _field_size(number: int, body: int) -> int:
    return len(tag(number, LEN)) + len(varint(body)) + body


def write_caffemodel(path: str | Path, name: str, layers: Iterable[tuple[Any, list[torch.Tensor], list[torch.Tensor | None]]]) -> None:
    """Write a NetParameter: ``name`` and, per layer, (LayerParameter without blobs, data tensors, diff tensors or None).

    Memory beyond the tensors themselves: the layers' headers. The file's size is known before the first byte, so
    its blocks are reserved up front.
    """
    raw = name.encode()
    parts = []
    for lp, data, diffs in layers:
        head = lp.SerializeToString()
        parts.append((head, [BlobBytes(tuple(t.shape), _array(t), None if d is None else _array(d))
                             for t, d in zip(data, diffs, strict=True)]))
    size = (_field_size(1, len(raw)) if raw else 0) + sum(_field_size(100, _message_size(h, 7, b)) for h, b in parts)
    with replacing(path, size) as f:
        if raw:
            f.write(tag(1, LEN) + varint(len(raw)) + raw)
        for head, blobs in parts:
            _write_message(f, 100, head, 7, blobs)


def write_solverstate(path: str | Path, *, it: int, learned_net: str, current_step: int, history: list[torch.Tensor]) -> None:
    """Write a SolverState (iter, learned_net, history blobs, current_step) in Caffe's binary layout."""
    raw = learned_net.encode()
    blobs = [BlobBytes(tuple(h.shape), _array(h)) for h in history]
    head = tag(1, VARINT) + varint(it) + tag(2, LEN) + varint(len(raw)) + raw
    tail = tag(4, VARINT) + varint(current_step)
    with replacing(path, len(head) + sum(_field_size(3, b.size) for b in blobs) + len(tail)) as f:
        f.write(head)
        for b in blobs:
            f.write(tag(3, LEN) + varint(b.size))
            for piece in b.pieces:
                f.write(piece)
        f.write(tail)


class _Reader:
    """A cursor over protobuf wire format in a buffer."""

    def __init__(self, buf: Any, start: int, end: int, source: str) -> None:
        self.buf, self.pos, self.end, self.source = buf, start, end, source

    def varint(self) -> int:
        shift = result = 0
        while True:
            if self.pos >= self.end:
                raise CaffeFormatError(f"{self.source}: truncated (a number runs past the end); the file is damaged or of another kind")
            b = int(self.buf[self.pos])
            self.pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def fields(self) -> Iterator[tuple[int, int, int, int]]:
        """(field number, wire type, value or start, length) for each field up to ``end``."""
        while self.pos < self.end:
            key = self.varint()
            number, wire = key >> 3, key & 7
            if wire == VARINT:
                yield number, wire, self.varint(), 0
            elif wire == LEN:
                n = self.varint()
                start = self.pos
                self.pos += n
                if self.pos > self.end:
                    raise CaffeFormatError(f"{self.source}: truncated (field {number} claims {n} bytes past the end); "
                                           "the file is damaged or of another kind")
                yield number, wire, start, n
            elif wire == I32:
                self.pos += 4
                yield number, wire, self.pos - 4, 4
            elif wire == I64:
                self.pos += 8
                yield number, wire, self.pos - 8, 8
            else:
                raise CaffeFormatError(f"{self.source}: wire type {wire} at byte {self.pos} is not protobuf; the file is not a Caffe model")


@dataclass
class LayerBlobs:
    """A layer's name, type and blob arrays (views of the file's memory map while it is open)."""

    name: str
    type: str
    blobs: list[np.ndarray]


def _blob(buf: Any, start: int, n: int, source: str) -> np.ndarray:
    r = _Reader(buf, start, start + n, source)
    dims: list[int] = []
    legacy = [0, 0, 0, 0]
    data: np.ndarray | None = None
    floats: list[float] = []
    for number, wire, v, ln in r.fields():
        if number == 7 and wire == LEN:
            s = _Reader(buf, v, v + ln, source)
            for num2, w2, v2, l2 in s.fields():
                if num2 == 1 and w2 == LEN:
                    d = _Reader(buf, v2, v2 + l2, source)
                    while d.pos < d.end:
                        dims.append(d.varint())
                elif num2 == 1:
                    dims.append(v2)
        elif number in (5, 8) and wire == LEN:
            data = np.frombuffer(buf, dtype="<f4" if number == 5 else "<f8", count=ln // (4 if number == 5 else 8), offset=v)
        elif number == 5 and wire == I32:
            floats.append(struct.unpack_from("<f", buf, v)[0])
        elif number in (1, 2, 3, 4) and wire == VARINT:
            legacy[number - 1] = v
    if data is None:
        data = np.asarray(floats, np.float32)
    shape = tuple(dims) if dims else (tuple(legacy) if any(legacy) else (data.size,))
    if int(np.prod(shape)) != data.size:
        raise CaffeFormatError(f"{source}: a blob of shape {list(shape)} holds {data.size} values; the file is truncated or damaged")
    return data.reshape(shape)


def _layer(buf: Any, start: int, n: int, source: str, v1: bool) -> LayerBlobs:
    name_f, type_f, blobs_f = (4, 5, 6) if v1 else (1, 2, 7)
    out = LayerBlobs("", "", [])
    for number, wire, v, ln in _Reader(buf, start, start + n, source).fields():
        if number == name_f and wire == LEN:
            out.name = bytes(buf[v:v + ln]).decode(errors="replace")
        elif number == type_f:
            out.type = bytes(buf[v:v + ln]).decode(errors="replace") if wire == LEN else str(v)
        elif number == blobs_f and wire == LEN:
            out.blobs.append(_blob(buf, v, ln, source))
        elif v1 and number == 1 and wire == LEN:                 # a V0 layer inside a V1 one
            for n2, w2, v2, l2 in _Reader(buf, v, v + ln, source).fields():
                if n2 == 1 and w2 == LEN:
                    out.name = out.name or bytes(buf[v2:v2 + l2]).decode(errors="replace")
                elif n2 == 50 and w2 == LEN:
                    out.blobs.append(_blob(buf, v2, l2, source))
    return out


class CaffemodelReader:
    """The layers of a binary .caffemodel (V0, V1 or current) from a memory map; use as a context manager."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.file = open(self.path, "rb")       # noqa: SIM115 - closed by close() / __exit__
        except OSError as e:
            raise CaffeFormatError(f"cannot read {self.path}: {e.strerror}") from None
        size = self.path.stat().st_size
        self.map: Any = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __enter__(self) -> CaffemodelReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if isinstance(self.map, mmap.mmap):
            with contextlib.suppress(BufferError):      # arrays still view it; it closes when they go
                self.map.close()
        self.file.close()

    def layers(self) -> Iterator[LayerBlobs]:
        src = str(self.path)
        for number, wire, v, ln in _Reader(self.map, 0, len(self.map), src).fields():
            if number in (100, 2) and wire == LEN:
                yield _layer(self.map, v, ln, src, v1=number == 2)


def write_hdf5_weights(path: str | Path, layers: Iterable[tuple[str, list[torch.Tensor], list[torch.Tensor | None]]]) -> None:
    """Caffe's Net::ToHDF5: groups data/<layer>/<blob index> (and diff/... when diffs are given)."""
    import h5py
    with atomic_path(path, put=swap_in) as tmp, h5py.File(tmp, "w") as f:
        data, diff = f.create_group("data"), None
        for name, blobs, diffs in layers:
            g = data.create_group(name)
            for i, t in enumerate(blobs):
                g.create_dataset(str(i), data=_array(t))
            if any(d is not None for d in diffs):
                diff = diff if diff is not None else f.create_group("diff")
                gd = diff.create_group(name)
                for i, d in enumerate(diffs):
                    if d is not None:
                        gd.create_dataset(str(i), data=_array(d))


def read_hdf5_weights(path: str | Path) -> list[LayerBlobs]:
    """The layers of a .caffemodel.h5 (each layer's blobs in index order)."""
    import h5py
    try:
        with h5py.File(path, "r") as f:
            if "data" not in f:
                raise CaffeFormatError(f"{path}: no 'data' group; not a Caffe HDF5 model")
            out = []
            for name, g in f["data"].items():
                keys = sorted(g.keys(), key=int)
                out.append(LayerBlobs(name, "", [np.asarray(g[k], np.float32) for k in keys]))
            return out
    except OSError as e:
        raise CaffeFormatError(f"cannot read {path} as HDF5: {e}") from None


def write_hdf5_solverstate(path: str | Path, *, it: int, learned_net: str, current_step: int, history: list[torch.Tensor]) -> None:
    """Caffe's SGDSolver::SnapshotSolverStateToHDF5: iter, learned_net, current_step, history/<i>."""
    import h5py
    with atomic_path(path, put=swap_in) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("iter", data=np.int32(it))
        f.create_dataset("learned_net", data=np.bytes_(learned_net.encode()))
        f.create_dataset("current_step", data=np.int32(current_step))
        g = f.create_group("history")
        for i, h in enumerate(history):
            g.create_dataset(str(i), data=_array(h))


def read_hdf5_solverstate(path: str | Path) -> tuple[int, str, int, list[np.ndarray]]:
    """(iter, learned_net, current_step, history arrays) of a .solverstate.h5."""
    import h5py
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in ("iter", "learned_net", "history") if k not in f]
            if missing:
                raise CaffeFormatError(f"{path}: no {', '.join(missing)}; not a Caffe HDF5 solver state")
            it = int(np.asarray(f["iter"]))
            raw = np.asarray(f["learned_net"]).item()
            net = raw.decode() if isinstance(raw, bytes) else str(raw)
            step = int(np.asarray(f["current_step"])) if "current_step" in f else 0
            hist = [np.asarray(f["history"][k], np.float32) for k in sorted(f["history"].keys(), key=int)]
            return it, net, step, hist
    except OSError as e:
        raise CaffeFormatError(f"cannot read {path} as HDF5: {e}") from None
