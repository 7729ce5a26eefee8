"""What an elastic host agent imports ahead of time, and how a forked rank then runs the user's program.

Starting a rank costs mostly imports (PyTorch: seconds, TensorFlow: tens of seconds on a
busy machine), which a new world after a lost host would pay again. So each host's agent
imports, once, the modules the training script imports at its top level (read from its
source, nothing executed), and each rank is a ``fork`` of that warm interpreter that then
runs the script as ``python`` would. MPI is never initialised in the agent (``mpi4py.MPI``
is refused there), so each forked rank initialises its own. Programs that are not Python
(or use interpreter options other than ``-u``) are started with ``exec`` instead.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import shutil
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path

#: Entry points (``[project.entry-points."ddl.preload"]``): ``module = "pkg.mod:function"``; the
#: function runs in the agent after the imports when ``module`` was imported (warms lazy imports).
PRELOAD_GROUP = "ddl.preload"


@dataclasses.dataclass(frozen=True)
class PythonTarget:
    """A Python program as ``python`` would run it.

    Attributes:
        kind: ``"path"`` (a script or a console script), ``"module"`` (``-m``) or ``"code"`` (``-c``).
        target: the script's path, the module's name, or the code.
        argv: ``sys.argv`` for the program.
        unbuffered: ``-u`` was given.
    """

    kind: str
    target: str
    argv: list[str]
    unbuffered: bool = False


def python_target(argv: Sequence[str], executable: str = sys.executable) -> PythonTarget | None:
    """How to run ``argv`` inside this interpreter, or None when it needs ``exec``.

    ``argv[0]`` must be this interpreter (ddlrun puts it in place of ``python``) or a
    script whose ``#!`` line names a Python (console scripts such as ``ddl-caffe``).

    Example:
        >>> python_target(["/usr/bin/python3", "-u", "train.py", "--lr", "1"], "/usr/bin/python3")
        PythonTarget(kind='path', target='train.py', argv=['train.py', '--lr', '1'], unbuffered=True)
    """
    if not argv:
        return None
    first = shutil.which(argv[0]) or argv[0]
    if _same_file(first, executable):
        return _interpreter_arguments(list(argv[1:]))
    if _python_script(first):
        return PythonTarget("path", first, [argv[0], *argv[1:]])
    return None


def _interpreter_arguments(args: list[str]) -> PythonTarget | None:
    unbuffered = False
    while args and args[0].startswith("-") and args[0] != "-":
        option = args.pop(0)
        if option == "-u":
            unbuffered = True
        elif option in ("-m", "-c") and args:
            value = args.pop(0)
            kind = "module" if option == "-m" else "code"
            return PythonTarget(kind, value, [value if kind == "module" else "-c", *args], unbuffered)
        else:
            return None  # other interpreter options change how Python itself runs: exec it
    if not args or args[0] == "-":
        return None
    return PythonTarget("path", args[0], args, unbuffered)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _python_script(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def imports_of(target: PythonTarget) -> list[str]:
    """Modules the program imports at its top level (also inside top-level ``if``/``try``).

    Nothing is run: the source is parsed. A module run with ``-m`` counts itself (its
    package's imports run first) and what it imports.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.py"
        >>> _ = p.write_text("import numpy as np\\nfrom ddl import torch\\nif 1:\\n    import json\\n")
        >>> imports_of(PythonTarget("path", str(p), [str(p)]))
        ['numpy', 'ddl', 'ddl.torch', 'json']
    """
    names: list[str] = []
    if target.kind == "code":
        source = target.target
    else:
        path = target.target
        if target.kind == "module":
            spec = importlib.util.find_spec(target.target)
            if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
                return [target.target.rpartition(".")[0]] if "." in target.target else []
            path = spec.origin
            if "." in target.target:
                names.append(target.target.rpartition(".")[0])
        try:
            source = Path(path).read_text()
        except (OSError, UnicodeDecodeError):
            return names
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return names
    for node in _top_level(tree.body):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*"]
    return list(dict.fromkeys(names))


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            out += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            out += _top_level(node.body)
    return out


class _RefuseMPI(importlib.abc.MetaPathFinder):
    """Keeps ``mpi4py.MPI`` (which initialises MPI when imported) out of the agent."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "mpi4py.MPI":
            raise ImportError("mpi4py.MPI is not imported in ddl's elastic agent (each rank initialises MPI)")
        return None


_REFUSE = _RefuseMPI()


def preload(names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Import ``names`` (MPI refused), then run the ``ddl.preload`` warm-ups of imported frameworks.

    Returns:
        (imported, failed: name -> why). A name that is an attribute rather than a module
        (``from x import function``) is skipped silently.
    """
    if _REFUSE not in sys.meta_path:
        sys.meta_path.insert(0, _REFUSE)
    imported: list[str] = []
    failed: dict[str, str] = {}
    for name in names:
        try:
            importlib.import_module(name)
            imported.append(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a missing dependency, not an attribute imported with from
                failed[name] = str(exc)
        except BaseException as exc:  # a module that fails here fails again in the rank, with its traceback
            failed[name] = f"{type(exc).__name__}: {exc}"
    for ep in entry_points(group=PRELOAD_GROUP):
        if ep.name in sys.modules:
            try:
                ep.load()()
                imported.append(f"{ep.value}()")
            except BaseException as exc:
                failed[ep.value] = f"{type(exc).__name__}: {exc}"
    return imported, failed


def allow_mpi() -> None:
    """In a forked rank: let ``mpi4py.MPI`` be imported again."""
    while _REFUSE in sys.meta_path:
        sys.meta_path.remove(_REFUSE)


def run_target(target: PythonTarget) -> int:
    """Run the program in this process as ``python`` would; returns its exit status."""
    if target.unbuffered:
        for stream in (sys.stdout, sys.stderr):
            reconfigure = getattr(stream, "reconfigure", None)
            if reconfigure is not None:
                reconfigure(write_through=True)
    sys.argv = list(target.argv)
    try:
        if target.kind == "path":
            sys.path[0] = os.path.dirname(os.path.abspath(target.target))
            runpy.run_path(target.target, run_name="__main__")
        elif target.kind == "module":
            sys.path[0] = os.getcwd()
            runpy.run_module(target.target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = ""
            exec(compile(target.target, "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        return _exit_status(exc.code)
    except BaseException:
        # What the interpreter prints for an uncaught exception (sys.excepthook: ddl's abort
        # hook when ddl.init installed it).
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1

