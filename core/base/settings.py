"""The settings table: every ``DDL_*`` variable once, with its type, default, flag and help.

:class:`~ddl.base.config.Config` declares its fields with :func:`setting`, so the
dataclass *is* the table: the environment reader, the set that ranks compare at
``init``, ``ddlrun``'s flags and the docs' configuration reference are all read from
:data:`SETTINGS` (see :func:`table`), and nothing else names a variable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


class SettingError(ValueError):
    """A ``DDL_*`` value of the wrong form; the message names the variable and an example."""


#: (variable, raw text) -> value; raises :class:`SettingError`.
Parser = Callable[[str, str], Any]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One row of the table.

    Attributes:
        field: the :class:`~ddl.base.config.Config` attribute.
        env: the environment variable (``DDL_...``).
        default: the value when the variable is unset or blank.
        parse: text -> value, raising :class:`SettingError` with an example.
        help: one sentence for ``ddlrun --help`` and the docs (``{algorithms}`` is
            filled in by the layers that know the algorithms).
        flag: ``ddlrun``'s flag for it, or None (set the variable instead).
        agreed: ranks compare it at ``init``: it changes which MPI calls a rank makes.
        agree_as: the text compared for an agreed setting (default: ``str(value)``).
        metavar: the value's name in help.
        unit: how the docs print the default (``bytes``, ``ms``, ``seconds``, ``bool``, ``text``).
    """

    field: str
    env: str
    default: Any
    parse: Parser
    help: str
    flag: str | None = None
    agreed: bool = False
    agree_as: Callable[[Any], str] | None = None
    metavar: str = "VALUE"
    unit: str = "text"

    def read(self, env: dict[str, str] | Any) -> Any:
        """This setting's value from ``env`` (a mapping of variables)."""
        raw = env.get(self.env, "").strip()
        return self.default if not raw else self.parse(self.env, raw)

    def agreed_text(self, value: Any) -> str:
        return self.agree_as(value) if self.agree_as is not None else str(value)

    def default_text(self) -> str:
        """The default as the docs and ``--help`` print it."""
        d = self.default
        if d is None:
            return "unset"
        if self.unit == "bytes":
            return _bytes(int(d))
        if self.unit == "ms":
            return f"{d * 1e3:g} ms"
        if self.unit == "bool":
            return "1" if d else "0"
        return str(d)

    @property
    def is_bool(self) -> bool:
        return self.unit == "bool"


def setting(env: str, default: Any, parse: Parser, help: str, **kw: Any) -> Any:
    """A dataclass field that carries its :class:`Setting` (``field`` is filled in by :func:`table`)."""
    row = Setting(field="", env=env, default=default, parse=parse, help=help, **kw)
    return dataclasses.field(default=default, metadata={"setting": row})


def table(cls: type) -> tuple[Setting, ...]:
    """The rows declared on the dataclass ``cls``, in field order, with their field names."""
    return tuple(dataclasses.replace(f.metadata["setting"], field=f.name)
                 for f in dataclasses.fields(cls) if "setting" in f.metadata)


# -- parsers -------------------------------------------------------------------------


def text(env: str, raw: str) -> str:
    return raw


def boolean(env: str, raw: str) -> bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise SettingError(f"{env}={raw!r} is not a boolean; use 1 or 0")


def whole(minimum: int, example: int) -> Parser:
    """A whole number of at least ``minimum`` (bytes, counts)."""
    def parse(env: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise SettingError(f"{env}={raw!r} is not a whole number; set e.g. {env}={example}") from None
        if value < minimum:
            raise SettingError(f"{env}={raw!r} must be at least {minimum}; set e.g. {env}={example}")
        return value
    return parse


def positive(example: float, scale: float = 1.0) -> Parser:
    """A positive number, multiplied by ``scale`` (milliseconds to seconds: 1e-3)."""
    def parse(env: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise SettingError(f"{env}={raw!r} is not a number; set e.g. {env}={example:g}") from None
        if not value > 0:
            raise SettingError(f"{env}={raw!r} must be positive; set e.g. {env}={example:g}")
        return value * scale
    return parse


def one_of(*choices: str) -> Parser:
    """One of ``choices`` (case-insensitive)."""
    def parse(env: str, raw: str) -> str:
        low = raw.lower()
        if low not in choices:
            raise SettingError(f"{env}={raw!r} is not one of {', '.join(choices)}; set e.g. {env}={choices[0]}")
        return low
    return parse


def on_off_or_path(env: str, raw: str) -> str | None:
    """``on`` (None: measure), ``off``, or a file path."""
    low = raw.lower()
    if low == "on":
        return None
    return "off" if low == "off" else raw


def _bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"
