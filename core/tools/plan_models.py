"""Gradient sizes for ``ddl plan``: a list, an ONNX file, a torch module, or a built-in model.

Every source yields the element counts of the trainable tensors in parameter
(forward) order; gradients are reduced in reverse of it.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path

# ONNX protobuf fields (onnx.proto): ModelProto.graph = 7, GraphProto.initializer = 5,
# TensorProto.dims = 1, .data_type = 2, .name = 8; data types 1 FLOAT, 10 FLOAT16,
# 11 DOUBLE, 16 BFLOAT16 are the floating ones (the rest cannot be trained).
_FLOAT_TYPES = {1, 10, 11, 16}
# Initializers of normalisation statistics are buffers, not gradients.
_BUFFER_WORDS = ("running_mean", "running_var", "num_batches_tracked")


class ModelSpecError(ValueError):
    """The model could not be read; the message says what was given and what is accepted."""


def resnet50_shapes() -> list[tuple[int, ...]]:
    """ResNet-50's trainable tensors (He et al. 2015, torchvision layout: conv kernels (out, in, kh, kw))."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]  # conv1, bn1 weight and bias
    inplanes = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(width, inplanes, 1, 1), (width,), (width,), (width, width, 3, 3), (width,), (width,),
                       (4 * width, width, 1, 1), (4 * width,), (4 * width,)]
            if b == 0:
                shapes += [(4 * width, inplanes, 1, 1), (4 * width,), (4 * width,)]  # downsample conv and bn
            inplanes = 4 * width
    return [*shapes, (1000, 2048), (1000,)]


def resnet50_sizes() -> list[int]:
    """ResNet-50 (He et al. 2015, torchvision layout) trainable tensors: 25,557,032 parameters."""
    return [math.prod(s) for s in resnet50_shapes()]


BUILTIN = {"resnet50": resnet50_sizes}
BUILTIN_SHAPES = {"resnet50": resnet50_shapes}


def parse_sizes(text: str) -> list[int]:
    """``"1000,2048x1000,64"``: element counts (``AxB`` multiplies), comma or whitespace separated."""
    out = []
    for word in text.replace(",", " ").split():
        try:
            n = math.prod(int(d) for d in word.lower().split("x"))
        except ValueError:
            raise ModelSpecError(f"gradient size {word!r} is not a count like 1000 or 2048x1000") from None
        if n < 1:
            raise ModelSpecError(f"gradient size {word!r} must be at least 1 element")
        out.append(n)
    if not out:
        raise ModelSpecError(f"{text!r} lists no gradient sizes; give counts like 1000,2048x1000")
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(data):
            raise ModelSpecError("truncated protobuf varint")
        b = data[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of one protobuf message, in order."""
    out: list[tuple[int, int, int | bytes]] = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            out.append((field, wire, value))
        elif wire == 2:
            n, i = _varint(data, i)
            out.append((field, wire, data[i : i + n]))
            i += n
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ModelSpecError(f"unsupported protobuf wire type {wire}")
    return out


def onnx_sizes(path: str | Path) -> list[int]:
    """Element counts of an ONNX model's floating-point initializers (not BN statistics)."""
    return [math.prod(s) for s in onnx_shapes(path)]


def onnx_shapes(path: str | Path) -> list[tuple[int, ...]]:
    """Shapes of an ONNX model's floating-point initializers (not BN statistics)."""
    try:
        data = Path(path).read_bytes()
        graph = next(v for f, w, v in _fields(data) if f == 7 and w == 2)
    except StopIteration:
        raise ModelSpecError(f"{path}: no graph in this ONNX file") from None
    except OSError as exc:
        raise ModelSpecError(f"cannot read ONNX file {path} ({exc})") from None
    assert isinstance(graph, bytes)
    sizes: list[tuple[int, ...]] = []
    for field, wire, tensor in _fields(graph):
        if field != 5 or wire != 2:
            continue
        assert isinstance(tensor, bytes)
        dims: list[int] = []
        dtype, name = 0, ""
        for f, w, v in _fields(tensor):
            if f == 1 and w == 0:
                dims.append(int(v))  # type: ignore[arg-type]
            elif f == 1 and w == 2:  # packed dims
                j, packed = 0, v
                assert isinstance(packed, bytes)
                while j < len(packed):
                    d, j = _varint(packed, j)
                    dims.append(d)
            elif f == 2 and w == 0:
                dtype = int(v)  # type: ignore[arg-type]
            elif f == 8 and w == 2:
                name = bytes(v).decode("utf-8", "replace")  # type: ignore[arg-type]
        if dtype in _FLOAT_TYPES and not any(word in name for word in _BUFFER_WORDS):
            sizes.append(tuple(dims))
    if not sizes:
        raise ModelSpecError(f"{path}: the ONNX graph has no floating-point initializers (weights)")
    return sizes


def torch_sizes(target: str) -> list[int]:
    """``package.module:factory``: call it (no arguments) and count trainable parameters."""
    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
        model = factory()
    except (ImportError, AttributeError) as exc:
        raise ModelSpecError(f"cannot load torch module {target!r} ({exc}); give package.module:factory") from None
    return [int(p.numel()) for p in model.parameters() if p.requires_grad]


def gradient_sizes(spec: str) -> tuple[list[int], str]:
    """The sizes for a ``--model`` value and a description of where they came from.

    ``resnet50`` (built in), ``FILE.onnx``, ``package.module:factory`` (torch, imported
    only here), ``@FILE`` (sizes in a text file), or sizes inline (``1000,2048x1000``).
    """
    if spec in BUILTIN:
        return BUILTIN[spec](), f"built-in {spec}"
    if spec.endswith(".onnx"):
        return onnx_sizes(spec), f"ONNX {spec}"
    if spec.startswith("@"):
        try:
            return parse_sizes(Path(spec[1:]).read_text()), f"sizes from {spec[1:]}"
        except OSError as exc:
            raise ModelSpecError(f"cannot read sizes file {spec[1:]} ({exc})") from None
    if ":" in spec:
        return torch_sizes(spec), f"torch {spec}"
    return parse_sizes(spec), "sizes given"


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """``"2048x64,2048"``: shapes (``AxB`` is a matrix of A rows), as :func:`parse_sizes` reads them."""
    parse_sizes(text)  # its checks and messages
    return [tuple(int(d) for d in word.lower().split("x")) for word in text.replace(",", " ").split()]


def torch_shapes(target: str) -> list[tuple[int, ...]]:
    """``package.module:factory``: the shapes of its trainable parameters."""
    module_name, _, attr = target.partition(":")
    try:
        model = getattr(importlib.import_module(module_name), attr)()
    except (ImportError, AttributeError) as exc:
        raise ModelSpecError(f"cannot load torch module {target!r} ({exc}); give package.module:factory") from None
    return [tuple(int(d) for d in p.shape) for p in model.parameters() if p.requires_grad]


def gradient_shapes(spec: str) -> tuple[list[tuple[int, ...]], str]:
    """Like :func:`gradient_sizes`, with each tensor's shape (what PowerSGD sees as a matrix).

    Sizes in a file or inline are read as shapes (``2048x1000`` is 2048 rows of 1000).
    """
    if spec in BUILTIN_SHAPES:
        return BUILTIN_SHAPES[spec](), f"built-in {spec}"
    if spec.endswith(".onnx"):
        return onnx_shapes(spec), f"ONNX {spec}"
    if spec.startswith("@"):
        try:
            return parse_shapes(Path(spec[1:]).read_text()), f"sizes from {spec[1:]}"
        except OSError as exc:
            raise ModelSpecError(f"cannot read sizes file {spec[1:]} ({exc})") from None
    if ":" in spec:
        return torch_shapes(spec), f"torch {spec}"
    return parse_shapes(spec), "sizes given"
