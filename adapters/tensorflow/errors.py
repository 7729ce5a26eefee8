"""Horovod's TensorFlow error classes for ddl's collective errors.

Horovod's TF ops fail with ``tf.errors.FailedPreconditionError`` when ranks submit
collectives that do not match, and ``tf.errors.InvalidArgumentError`` on bad arguments;
TF code catches those classes. ddl's core raises
:class:`ddl.MismatchError`. The class here is both, so ``except
tf.errors.FailedPreconditionError`` and ``except ddl.MismatchError`` each catch it. In a
graph, ``tf.numpy_function`` would report it as ``UnknownError``; :func:`status_of` gives
the code that :mod:`ddl.tensorflow.status_op` raises it with instead.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

import tensorflow as tf
from ddl.base.errors import MismatchError


class CollectiveMismatchError(tf.errors.FailedPreconditionError, MismatchError):  # type: ignore[misc]
    """Ranks submitted collectives that do not agree; raised on every rank."""

    def __init__(self, message: str) -> None:
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)

    def __reduce__(self) -> Any:  # OpError's own takes (node_def, op, message)
        return (type(self), (self.message,))


class CollectiveArgumentError(tf.errors.InvalidArgumentError, ValueError):  # type: ignore[misc]
    """A collective refused its arguments (Horovod's ``InvalidArgumentError``); also a ``ValueError``."""

    def __init__(self, message: str) -> None:
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)

    def __reduce__(self) -> Any:
        return (type(self), (self.message,))


def as_tf_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with :class:`ddl.MismatchError` raised as :class:`CollectiveMismatchError` and a
    ``ValueError`` (bad arguments) as :class:`CollectiveArgumentError`."""

    @wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (CollectiveMismatchError, CollectiveArgumentError):
            raise
        except MismatchError as exc:
            raise CollectiveMismatchError(str(exc)) from exc
        except ValueError as exc:
            raise CollectiveArgumentError(str(exc)) from exc

    return wrapped


def status_of(exc: BaseException) -> tuple[int, str] | None:
    """``(TF status code, message)`` for a TensorFlow error class, else None (raise it as it is)."""
    if isinstance(exc, tf.errors.OpError) and exc.error_code != tf.errors.OK:
        return int(exc.error_code), str(exc.message)
    return None
