"""Caffe's message classes, built at import from ``caffe.proto`` (package data: BVLC's messages and the forks') with no generated code."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTO_FILE = "caffe.proto"

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "double": _F.TYPE_DOUBLE, "float": _F.TYPE_FLOAT, "int64": _F.TYPE_INT64, "uint64": _F.TYPE_UINT64,
    "int32": _F.TYPE_INT32, "uint32": _F.TYPE_UINT32, "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
}
_LABELS = {"optional": _F.LABEL_OPTIONAL, "repeated": _F.LABEL_REPEATED, "required": _F.LABEL_REQUIRED}
_TOKENS = re.compile(r'"[^"]*"|[A-Za-z_][A-Za-z0-9_.]*|-?[0-9][0-9.eE+-]*|[{}=;\[\],]')
_PACKAGE = "caffe"


def _tokens(text: str) -> list[str]:
    return _TOKENS.findall(re.sub(r"//[^\n]*", "", text))


class _Reader:
    """A cursor over the tokens of the restricted proto2 grammar of ``caffe.proto``."""

    def __init__(self, tokens: list[str]) -> None:
        self.t, self.i = tokens, 0

    def peek(self) -> str:
        return self.t[self.i]

    def take(self, expect: str | None = None) -> str:
        tok = self.t[self.i]
        if expect is not None and tok != expect:
            raise ValueError(f"caffe.proto: expected {expect!r} at token {self.i}, got {tok!r}")
        self.i += 1
        return tok

    def done(self) -> bool:
        return self.i >= len(self.t)


def _enum(r: _Reader) -> descriptor_pb2.EnumDescriptorProto:
    e = descriptor_pb2.EnumDescriptorProto(name=r.take())
    r.take("{")
    while r.peek() != "}":
        name = r.take()
        r.take("=")
        e.value.add(name=name, number=int(r.take()))
        r.take(";")
    r.take("}")
    return e


def _message(r: _Reader, m: Any, messages: set[str], enums: set[str], scoped: set[str]) -> None:
    m.name = r.take()
    r.take("{")
    while r.peek() != "}":
        if r.peek() == "enum":
            r.take()
            m.enum_type.append(_enum(r))
            continue
        label, typ, name = r.take(), r.take(), r.take()
        r.take("=")
        f = m.field.add(name=name, number=int(r.take()), label=_LABELS[label])
        nested = {e.name for e in m.enum_type}
        if typ in _SCALARS:
            f.type = _SCALARS[typ]
        elif typ in nested:
            f.type, f.type_name = _F.TYPE_ENUM, f".{_PACKAGE}.{m.name}.{typ}"
        elif typ in enums or typ in scoped:      # top-level, or another message's (Msg.Enum)
            f.type, f.type_name = _F.TYPE_ENUM, f".{_PACKAGE}.{typ}"
        elif typ in messages:
            f.type, f.type_name = _F.TYPE_MESSAGE, f".{_PACKAGE}.{typ}"
        else:
            raise ValueError(f"caffe.proto: unknown type {typ!r} in message {m.name}")
        if r.peek() == "[":
            r.take()
            while True:
                key = r.take()
                r.take("=")
                val = r.take().strip('"')
                if key == "default":
                    f.default_value = val
                elif key == "packed":
                    f.options.packed = val == "true"
                if r.take() == "]":
                    break
        r.take(";")
    r.take("}")


def proto_text() -> str:
    """The text of ``caffe.proto`` as installed beside this module."""
    return resources.files(__package__).joinpath(PROTO_FILE).read_text(encoding="utf-8")


def build_file(text: str | None = None) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto of package ``caffe`` from ``text`` (default: ``caffe.proto``), proto2 syntax."""
    fd = descriptor_pb2.FileDescriptorProto(name=PROTO_FILE, package=_PACKAGE, syntax="proto2")
    toks = _tokens(proto_text() if text is None else text)
    # Every message name and top-level enum is known before any field is typed.
    messages = {toks[i + 1] for i, t in enumerate(toks) if t == "message"}
    depth, enums, scoped, current = 0, set(), set(), ""
    for i, t in enumerate(toks):
        depth += (t == "{") - (t == "}")
        if t == "message" and depth == 0:
            current = toks[i + 1]
        if t == "enum" and depth == 0:
            enums.add(toks[i + 1])
        elif t == "enum" and depth == 1:
            scoped.add(f"{current}.{toks[i + 1]}")
    r = _Reader(toks)
    while not r.done():
        kind = r.take()
        if kind == "enum":
            fd.enum_type.append(_enum(r))
        elif kind == "message":
            _message(r, fd.message_type.add(), messages, enums, scoped)
        elif kind == "syntax":                    # syntax = "proto2";
            r.take("=")
            if r.take() != '"proto2"':
                raise ValueError(f"{PROTO_FILE}: only proto2 syntax is read")
            r.take(";")
        elif kind == "package":                   # package caffe;
            if r.take() != _PACKAGE:
                raise ValueError(f"{PROTO_FILE}: the package must be {_PACKAGE}")
            r.take(";")
        else:
            raise ValueError(f"caffe.proto: unexpected token {kind!r}")
    return fd


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(build_file())


def message_class(name: str) -> Any:
    """The generated message class ``caffe.<name>`` (e.g. ``"NetParameter"``)."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


BlobShape = message_class("BlobShape")
BlobProto = message_class("BlobProto")
BlobProtoVector = message_class("BlobProtoVector")
Datum = message_class("Datum")
FillerParameter = message_class("FillerParameter")
NetParameter = message_class("NetParameter")
V1LayerParameter = message_class("V1LayerParameter")
NetState = message_class("NetState")
LayerParameter = message_class("LayerParameter")
SolverParameter = message_class("SolverParameter")
SolverState = message_class("SolverState")
TRAIN, TEST = 0, 1
