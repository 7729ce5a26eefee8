"""Checks of COMMAND before any rank starts: a misspelt program or script gets its closest match.

Without them, ``ddlrun -np 2 pyhton train.py`` ends in hydra's ``execvp error on file
pyhton`` on every rank (status 255), and ``python trian.py`` in N copies of Python's own
complaint.
"""

from __future__ import annotations

import difflib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from ddl.launcher.command import PYTHON_NAMES, LaunchError

#: ddlrun's status for a program that is not there (a shell's "command not found").
NOT_FOUND = 127


class ProgramNotFound(LaunchError):
    """COMMAND's program or script does not exist here; the message offers the closest match."""

    status = NOT_FOUND


def check_command(command: tuple[str, ...], *, path_dirs: Iterable[str], cwd: Path) -> None:
    """Raise when COMMAND cannot start here: its program is not on ``PATH`` (nor a file), or a
    Python script it names does not exist.

    Raises:
        ProgramNotFound: what is missing and, where one is close, what was meant.

    Example:
        >>> check_command(("pyhton", "x.py"), path_dirs=[], cwd=Path("."))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ddl.launcher.preflight.ProgramNotFound: program 'pyhton' not found on PATH; did you mean 'python'? ...
    """
    program = command[0]
    if program not in PYTHON_NAMES and not _runnable(program, path_dirs, cwd):
        where = "" if os.sep in program else " on PATH"
        near = difflib.get_close_matches(Path(program).name, _programs(path_dirs, program, cwd), n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ProgramNotFound(f"program {program!r} not found{where}{hint} (nothing was started; put the program "
                              "after ddlrun's options, e.g. ddlrun -np 2 python train.py)")
    if _is_python(program) and len(command) > 1:
        script = command[1]
        if script.endswith(".py") and not script.startswith("-") and not (cwd / script).is_file():
            folder = (cwd / script).parent
            names = [p.name for p in folder.glob("*.py")] if folder.is_dir() else []
            near = difflib.get_close_matches(Path(script).name, names, n=1, cutoff=0.6)
            hint = f"; did you mean {str(Path(script).parent / near[0])!r}?" if near else ""
            raise ProgramNotFound(f"script {script!r} not found in {cwd}{hint} (nothing was started)")


def _runnable(program: str, path_dirs: Iterable[str], cwd: Path) -> bool:
    if os.sep in program:
        path = cwd / program
        return path.is_file() and os.access(path, os.X_OK)
    return shutil.which(program, path=os.pathsep.join(path_dirs)) is not None


def _is_python(program: str) -> bool:
    name = Path(program).name
    return name in PYTHON_NAMES or name.startswith("python3")


def _programs(path_dirs: Iterable[str], program: str, cwd: Path) -> list[str]:
    """Names that could be meant: the executables on PATH (or in the program's folder), and python."""
    folders = [cwd / Path(program).parent] if os.sep in program else [Path(d) for d in path_dirs]
    names = set(PYTHON_NAMES)
    for folder in folders:
        try:
            names.update(entry.name for entry in os.scandir(folder) if entry.is_file() and os.access(entry, os.X_OK))
        except OSError:
            continue
    return sorted(names)
