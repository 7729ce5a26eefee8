"""The optional compiled op that gives collective errors in TF graphs their Horovod class.

TensorFlow's ``PyFunc`` kernel reports a Python ``ValueError``/``TypeError`` as
``InvalidArgumentError`` and every other exception as ``UnknownError``, whatever the
exception carries, so ranks that disagree cannot raise ``FailedPreconditionError`` (as
Horovod's ops do) from inside ``tf.numpy_function``. ``status_op.cc`` defines
``DdlCheckStatus``, which passes its tensors through or fails with a status code the host
call returned. It is built on request, never behind a user's back (a compiler run in the
first ``model.fit`` would be a surprise): ``python -m ddl.tensorflow.status_op`` compiles
it once per TensorFlow version into ``~/.cache/ddl/tensorflow`` where a C++ compiler and
TensorFlow's headers are present (``pip install`` stays pure Python; the repository's
``scripts/setup-env.sh`` runs it). Where it is not built, graph-mode mismatches arrive as
``UnknownError`` with the same message. Eager calls never need it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import tensorflow as tf
from ddl.base.atomic_write import atomic_path

SOURCE = Path(__file__).with_name("status_op.cc")
DEFAULT_CACHE = Path.home() / ".cache" / "ddl" / "tensorflow"
COMPILERS = ("c++", "g++", "clang++")
BUILD_TIMEOUT_S = 600.0

CheckStatus = Callable[..., list[Any]]  # ddl_check_status(code, message, tensors) -> tensors


class BuildError(RuntimeError):
    """The op could not be built here; the message says why."""


def library_name(source: bytes, tf_version: str, flags: Sequence[str]) -> str:
    """The cached library's file name: one per source, TensorFlow version and build flags."""
    key = hashlib.sha256("\0".join([tf_version, *flags]).encode() + b"\0" + source).hexdigest()[:16]
    return f"ddl_status_op-{tf_version}-{key}.so"


def build_command(compiler: str, source: Path, output: Path, compile_flags: Sequence[str],
                  link_flags: Sequence[str]) -> list[str]:
    """The compiler command line (TensorFlow's own flags from ``tf.sysconfig``)."""
    return [compiler, "-shared", "-fPIC", "-O2", "-w", *compile_flags, str(source), "-o", str(output), *link_flags]


def find_compiler() -> str | None:
    """The first C++ compiler on PATH."""
    found = [shutil.which(name) for name in COMPILERS]
    return next((path for path in found if path), None)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    # Ranks on one host start together: one compiles, the others wait and load its result.
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def library_path(cache_dir: Path | None = None) -> Path:
    """Where the library for the installed TensorFlow is (or would be) kept."""
    flags = [*tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    folder = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    return folder / library_name(SOURCE.read_bytes(), tf.__version__, flags)


def build(cache_dir: Path | None = None, *, compiler: str | None = None, quiet: bool = False) -> Path:
    """Compile the op for the installed TensorFlow (unless cached) and return the library's path.

    Args:
        cache_dir: where libraries are kept (default ``~/.cache/ddl/tensorflow``).
        compiler: a C++ compiler (default: the first of c++, g++, clang++ on PATH).
        quiet: do not announce a compilation on stderr.

    Raises:
        BuildError: no compiler, no TensorFlow headers, or the compiler failed (its output).

    Example:
        >>> build()  # doctest: +SKIP
        PosixPath('/home/me/.cache/ddl/tensorflow/ddl_status_op-2.21.0-1f2e....so')
    """
    compile_flags, link_flags = list(tf.sysconfig.get_compile_flags()), list(tf.sysconfig.get_link_flags())
    header = Path(tf.sysconfig.get_include()) / "tensorflow" / "core" / "framework" / "op_kernel.h"
    if not header.is_file():
        raise BuildError(f"this TensorFlow has no C++ headers ({header} is missing)")
    cxx = compiler or find_compiler()
    if cxx is None:
        raise BuildError(f"no C++ compiler on PATH (looked for {', '.join(COMPILERS)})")
    target = library_path(cache_dir)
    folder = target.parent
    if target.is_file():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"cannot create the cache folder {folder}: {exc}") from exc
    with _file_lock(target.with_suffix(".lock")):
        if target.is_file():  # another rank built it while this one waited
            return target
        if not quiet:
            print(f"ddl.tensorflow: compiling its status op for TensorFlow {tf.__version__} once "
                  f"(~10 s) into {folder}", file=sys.stderr, flush=True)
        fd, unique = tempfile.mkstemp(suffix=".so", dir=folder)  # a name no other builder (host) takes
        os.close(fd)
        with atomic_path(target, temporary=unique) as tmp:
            cmd = build_command(cxx, SOURCE, tmp, compile_flags, link_flags)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise BuildError(f"{cxx} did not run: {exc}") from exc
            if proc.returncode != 0:
                raise BuildError(f"{cxx} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
    return target


_lock = threading.Lock()
_loaded: list[CheckStatus | None] = []  # empty until the first load
_why_not = ""


@tf.autograph.experimental.do_not_convert  # type: ignore[misc,untyped-decorator]
def load() -> CheckStatus | None:
    """``ddl_check_status`` from the built library, or None where it is not built (or TensorFlow
    refuses to load it: reported once on stderr). Never compiles; see :func:`build`."""
    global _why_not
    with _lock:
        if _loaded:
            return _loaded[0]
        path = library_path()
        if not path.is_file():
            _why_not = f"not built for TensorFlow {tf.__version__} (run: python -m ddl.tensorflow.status_op)"
            return None  # looked for again next time: it may be built meanwhile
        fn: CheckStatus | None = None
        try:
            fn = tf.load_op_library(str(path)).ddl_check_status
        except Exception as exc:  # a library TensorFlow refuses to load: the same fallback
            _why_not = f"{type(exc).__name__}: {exc}"
            print(f"ddl.tensorflow: warning: could not load its status op ({_why_not}); collective errors "
                  "in TF graphs arrive as tf.errors.UnknownError", file=sys.stderr, flush=True)
        _loaded.append(fn)
        return fn


def why_not() -> str:
    """Why :func:`load` returned None ("" when it did not, or was not called)."""
    return _why_not


if __name__ == "__main__":
    try:
        print(build())
    except BuildError as exc:
        raise SystemExit(f"ddl.tensorflow: cannot build the status op: {exc}") from exc
