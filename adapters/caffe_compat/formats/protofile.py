"""Reading and writing Caffe's protobuf files: prototxt (text format) and binary protos, with precise errors; nets and solvers upgraded as Caffe upgrades them on load."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from google.protobuf import message as _message
from google.protobuf import text_format

from ddl.base.atomic_write import write_atomically
from ddl.caffe.formats import schema
from ddl.caffe.formats.errors import CaffeFormatError
from ddl.caffe.formats.upgrade import UpgradeError, upgrade_net, upgrade_solver

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
        if re.search(r"\blayers?\s*:?\s*$", text[:start]):
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


_SCAN = re.compile(r"""\s+|\#[^\n]*|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[{}<>\[\]:,;]|[^\s{}<>\[\]:,;\#"']+""")


def _position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def unknown_fields(text: str, descriptor: Any) -> list[tuple[int, int, str]]:
    """Every field name in protobuf text ``text`` that ``descriptor`` (recursively) lacks, as (line, column, name).

    A tolerant scan used to report all unknown fields at once after the strict parser found the first.
    """
    toks = [(m.group(0), m.start()) for m in _SCAN.finditer(text) if not m.group(0).isspace() and not m.group(0).startswith("#")]
    found: list[tuple[int, int, str]] = []

    def skip_value(i: int) -> int:
        if i < len(toks) and toks[i][0] in "{<":
            depth = 0
            while i < len(toks):
                depth += (toks[i][0] in "{<") - (toks[i][0] in "}>")
                i += 1
                if depth == 0:
                    break
            return i
        if i < len(toks) and toks[i][0] == "[":
            while i < len(toks) and toks[i][0] != "]":
                i += 1
            return i + 1
        while i < len(toks) and toks[i][0].startswith(("'", '"')) and i + 1 < len(toks) and toks[i + 1][0].startswith(("'", '"')):
            i += 1                                      # adjacent strings concatenate
        return i + 1

    def walk(i: int, desc: Any, close: str) -> int:
        while i < len(toks) and toks[i][0] != close:
            name, off = toks[i]
            if name in ",;":
                i += 1
                continue
            i += 1
            if i < len(toks) and toks[i][0] == ":":
                i += 1
            field = desc.fields_by_name.get(name) if desc is not None else None
            if field is None and desc is not None and not name.startswith("["):
                found.append((*_position(text, off), name))
            msg_type = field.message_type if field is not None else None
            is_msg = msg_type is not None
            if i < len(toks) and toks[i][0] in "{<" and is_msg:
                end = "}" if toks[i][0] == "{" else ">"
                i = walk(i + 1, msg_type, end) + 1
            elif i < len(toks) and toks[i][0] == "[" and is_msg:
                i += 1
                while i < len(toks) and toks[i][0] != "]":
                    if toks[i][0] in "{<":
                        i = walk(i + 1, msg_type, "}" if toks[i][0] == "{" else ">") + 1
                    else:
                        i += 1
                i += 1
            else:
                i = skip_value(i)
        return i

    walk(0, descriptor, "\0")
    return found


def parse_text(text: str, message: Any, *, source: str = "<string>") -> Any:
    """Parse protobuf text format into ``message`` (returned), with ``file:line:column`` errors.

    Nets in the V0 and V1 formats are upgraded as Caffe does on load (``ddl-caffe upgrade``
    writes the result).

    Raises:
        CaffeFormatError: malformed text, or fields the schema lacks (all of them, each named
            with its layer).
    """
    try:
        out = text_format.Parse(text, message)
    except text_format.ParseError as e:
        line, col = e.GetLine(), e.GetColumn()
        msg = re.sub(r"^\d+:\d+ : ", "", str(e))
        where = f"{source}:{line}:{col}" if line else source
        if _NO_FIELD.search(msg) and line:
            unknown = unknown_fields(text, message.DESCRIPTOR) or [(line, col, _NO_FIELD.search(msg).group(1))]  # type: ignore[union-attr]
            parts = []
            for ln, cl, name in unknown:
                layer = _layer_around(text, ln, cl)
                parts.append(f"{source}:{ln}:{cl}: field '{name}'" + (f" in {layer}" if layer else ""))
            raise CaffeFormatError(
                f"{len(parts)} field(s) that neither Caffe nor the forks ddl-caffe knows (misspelt, or from another "
                "Caffe fork):\n  " + "\n  ".join(parts)) from None
        raise CaffeFormatError(f"{where}: {msg}") from None
    if out.DESCRIPTOR.name == "NetParameter":
        _upgrade(out, source)
    return out


def _upgrade(net: Any, source: str) -> None:
    try:
        upgrade_net(net, source=source)
    except UpgradeError as e:
        raise CaffeFormatError(str(e)) from None


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
    """A ``SolverParameter`` from a prototxt file, upgraded as Caffe does (solver_type, snapshot_prefix)."""
    sp = read_text(path, schema.SolverParameter())
    try:
        upgrade_solver(sp, source=str(path))
    except UpgradeError as e:
        raise CaffeFormatError(str(e)) from None
    return sp


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
    if message.DESCRIPTOR.name == "NetParameter":
        _upgrade(message, str(p))
    return message


def write_binary(path: str | Path, message: Any) -> None:
    """Write ``message`` in binary wire format (written to a temporary name, then renamed)."""
    write_atomically(path, message.SerializeToString())


def upgrade_file(src: str | Path, dst: str | Path) -> str:
    """``ddl-caffe upgrade``: a net prototxt, a binary .caffemodel or a solver prototxt, upgraded and written to ``dst``.

    Returns:
        What was done, e.g. ``"binary net: V1 layers to the current format"``.

    Raises:
        CaffeFormatError: the input is none of these.
    """
    data = Path(src).read_bytes()
    try:
        text = data.decode("utf-8")
        binary = "\0" in text or str(src).endswith((".caffemodel", ".binaryproto"))
    except UnicodeDecodeError:
        binary = True
    if binary:
        net = schema.NetParameter()
        try:
            net.ParseFromString(data)
        except _message.DecodeError as e:
            raise CaffeFormatError(f"{src}: not a binary NetParameter ({e})") from None
        done = upgrade_net(net, source=str(src))
        write_binary(dst, net)
        return "binary net: " + ("; ".join(done) or "already current")
    try:
        net = parse_text(text, schema.NetParameter(), source=str(src))   # upgrades as it parses
        kind = "net"
        done = upgrade_net(text_format.Parse(text, schema.NetParameter()), source=str(src))
        out: Any = net
    except CaffeFormatError as net_error:
        try:
            sp = text_format.Parse(text, schema.SolverParameter())
        except text_format.ParseError:
            raise net_error from None
        kind = "solver"
        done = upgrade_solver(sp)
        for f in ("net_param", "train_net_param"):
            if sp.HasField(f):
                done += upgrade_net(getattr(sp, f), source=f"{src}: {f}")
        for p in sp.test_net_param:
            done += upgrade_net(p, source=f"{src}: test_net_param")
        out = sp
    Path(dst).write_text(text_format.MessageToString(out))
    return f"{kind}: " + ("; ".join(done) or "already current")
