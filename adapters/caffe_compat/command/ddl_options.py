"""IBM Caffe-DDL's ``--ddl`` option string (``"-mode r:2x2"``) mapped to ddl's algorithm and topology."""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass

log = logging.getLogger("ddl.caffe")

# DDL's mode letters, as ddl's topology parser knows them: r, the ring along every dimension
# (ddl's multiring; one ring when there is one dim); p, pick by ddl's cost model. One letter
# may stand for every dimension, or one per dimension when they all agree.
MODES = {"r": "multiring", "p": "auto"}
_IGNORED = {"-dump_iter": 1, "-dev_sync": 1, "-rebind_iter": 1, "-dbg_level": 1}


@dataclass(frozen=True)
class DdlOptions:
    """What an IBM DDL option string asks of ddl: None means ddl's own default."""

    algorithm: str | None = None
    topology: str | None = None


def parse(text: str) -> DdlOptions:
    """Parse e.g. ``"-mode r:2x2 -dump_iter 100"``.

    Raises:
        ValueError: unknown options or a malformed mode, with the accepted forms.

    Example:
        >>> parse("-mode r:2x2")
        DdlOptions(algorithm='multiring', topology='2x2')
    """
    toks = shlex.split(text or "")
    algo = topo = None
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "-mode":
            if i + 1 >= len(toks):
                raise ValueError("--ddl: -mode needs a value such as r:2x2")
            mode = toks[i + 1]
            letters, _, dims = mode.partition(":")
            letter = letters[:1]
            if not letters or set(letters) != {letter} or letter not in MODES:
                raise ValueError(f"--ddl: mode '{mode}' is unknown; use <letter>[:<dims>] (one letter, or the same one per dim) with letter one of {', '.join(MODES)} (e.g. r:4x2)")
            if dims and not all(d.isdigit() and int(d) > 0 for d in dims.split("x")):
                raise ValueError(f"--ddl: dims '{dims}' must be positive integers joined by 'x' (e.g. 4x2)")
            algo, topo = MODES[letter], dims or None
            i += 2
        elif t in _IGNORED:
            log.warning("--ddl: %s has no ddl equivalent and is ignored", t)
            i += 1 + _IGNORED[t]
        else:
            raise ValueError(f"--ddl: option '{t}' is not understood; supported: -mode <r|p>[:dims], "
                             f"{', '.join(_IGNORED)} (ignored)")
    return DdlOptions(algorithm=algo, topology=topo)
