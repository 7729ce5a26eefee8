"""Reading and writing Caffe files: prototxt (text format) and binary protos, with precise errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from google.protobuf import message as _message
from google.protobuf import text_format

from . import schema


class CaffeFormatError(ValueError):
    """A Caffe file could not be read; the message names the file, place and what to do."""


_V1 = re.compile(r"^\s*layers\s*\{", re.MULTILINE)
_NO_FIELD = re.compile(r'has no field named "?(\w+)"?')


def _layer_around(text: str, line: int, column: int) -> str:
    """Describe the ``layer { ... }`` block enclosing (line, column) as ``layer "n" (type T)``."""
    lines = text.splitlines(keepends=True)
    offset = sum(len(s) for s in lines[: line - 1]) + max(column - 1, 0)
    stack: list[int] = []   # start offsets of open blocks; strings and comments skipped
    i, in_str, opened = 0, "", []
    while i < min(offset, len(text)):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == in_str:
                in_str = ""
        elif c in "\"'":
            in_str = c
        elif c == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
        elif c == "{":
            stack.append(i)
            opened.append(i)
        elif c == "}" and stack:
            stack.pop()
        i += 1
    for start in reversed(stack):
        if re.search(r"\blayer\s*$", text[:start]):
            block = text[start:]
            depth, end = 0, len(block)
            for j, c in enumerate(block):
                depth += (c == "{") - (c == "}")
                if depth == 0:
                    end = j
                    break
            body = block[:end]
            name = re.search(r'^\s*name\s*:\s*"([^"]*)"', body, re.MULTILINE)
            typ = re.search(r'^\s*type\s*:\s*"([^"]*)"', body, re.MULTILINE)
            return (f'layer "{name.group(1) if name else "?"}" '
                    f'(type {typ.group(1) if typ else "?"})')
    return ""


def parse_text(text: str, message: Any, *, source: str = "<string>") -> Any:
    """Parse protobuf text format into ``message`` (returned), with ``file:line:column`` errors.

    Raises:
        CaffeFormatError: malformed text, an unknown or unsupported field (named with its
            layer), or a net in the V1 ``layers`` format.
    """
    if isinstance(message, schema.NetParameter) or message.DESCRIPTOR.name == "SolverParameter":
        m = _V1.search(text)
        if m:
            line = text.count("\n", 0, m.start()) + 1
            raise CaffeFormatError(
                f"{source}:{line}:1: this net uses the V1 'layers' format (from before 2015), which "
                "ddl-caffe does not read; convert it with Caffe's upgrade_net_proto_text tool, or "
                "rewrite each 'layers {' block as 'layer {' with a string type such as \"Convolution\"")
    try:
        return text_format.Parse(text, message)
    except text_format.ParseError as e:
        line, col = e.GetLine(), e.GetColumn()
        msg = re.sub(r"^\d+:\d+ : ", "", str(e))
        where = f"{source}:{line}:{col}" if line else source
        field = _NO_FIELD.search(msg)
        if field and line:
            layer = _layer_around(text, line, col)
            what = f" in {layer}" if layer else ""
            raise CaffeFormatError(
                f"{where}: field '{field.group(1)}'{what} is not supported by ddl-caffe (it is either "
                "misspelt or belongs to a Caffe layer ddl-caffe does not implement; see the README's "
                "list of supported layers)") from None
        raise CaffeFormatError(f"{where}: {msg}") from None


def read_text(path: str | Path, message: Any) -> Any:
    """Parse the prototxt at ``path`` into ``message``."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise CaffeFormatError(f"cannot read {p}: {e.strerror}") from None
    return parse_text(text, message, source=str(p))


def read_net(path: str | Path) -> Any:
    """A ``NetParameter`` from a prototxt file."""
    return read_text(path, schema.NetParameter())


def read_solver(path: str | Path) -> Any:
    """A ``SolverParameter`` from a prototxt file."""
    return read_text(path, schema.SolverParameter())


def write_text(path: str | Path, message: Any) -> None:
    """Write ``message`` as protobuf text format."""
    Path(path).write_text(text_format.MessageToString(message))


def read_binary(path: str | Path, message: Any) -> Any:
    """Parse a binary proto file (``.caffemodel``, ``.solverstate``, ``.binaryproto``)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise CaffeFormatError(f"cannot read {p}: {e.strerror}") from None
    try:
        message.ParseFromString(data)
    except _message.DecodeError as e:
        raise CaffeFormatError(
            f"{p}: not a valid binary {message.DESCRIPTOR.name} ({len(data)} bytes; {e}); the file is "
            "truncated or of another kind") from None
    if message.DESCRIPTOR.name == "NetParameter" and len(message.layers) and not len(message.layer):
        raise CaffeFormatError(
            f"{p}: this model is in the V1 'layers' format; upgrade it with Caffe's "
            "upgrade_net_proto_binary tool first")
    return message


def write_binary(path: str | Path, message: Any) -> None:
    """Write ``message`` in binary wire format (written to a temporary name, then renamed)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(message.SerializeToString())
    tmp.replace(p)
