"""Names for unnamed collectives: one counter per submitting thread, matched across ranks.

Ranks match unnamed requests by name, so a name must mean "the k-th unnamed call of
this thread" on every rank. One shared counter would interleave the threads of a
rank in whatever order the scheduler ran them, and ranks would pair one thread's
tensor with another's (silently wrong sums). So each thread counts on its own and
its name (``threading.current_thread().name``, alike on every rank for threads the
program creates in the same order) is part of the request's name.

Adapters may also :func:`label` a name with what it stands for in the user's terms (a
gradient bucket's parameters), which errors and stall reports then show beside it.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable


class ThreadNamer:
    """Hands out ``#<n>`` (main thread) or ``#<thread name>.<n>`` names, per thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # thread name -> (the live thread that counts under it, its counter cell)
        # (None until a thread of that name counts: another rank's names may come first, see catch_up)
        self._counters: dict[str, tuple[weakref.ref[threading.Thread] | None, list[int]]] = {}
        self._local = threading.local()  # this thread's (label, prefix, cell) once checked

    def next(self) -> str:
        """The next name for the calling thread.

        Raises:
            ValueError: another live thread of this process has the same name and
                also submits unnamed collectives, so their requests cannot be told apart.
        """
        stem, n = self.next_count()
        return f"{stem}{n}"

    def next_count(self) -> tuple[str, int]:
        """The next name for the calling thread as (stem, count): ``f"{stem}{count}"``
        is :meth:`next`'s name (the lean path formats it only when it needs it)."""
        mine = self._mine()
        cell = mine[2]
        with self._lock:  # catch_up may raise the count from the thread running a cycle
            cell[0] += 1
            n = cell[0]
        return mine[1], n

    def next_count_excluded(self) -> tuple[str, int]:
        """:meth:`next_count` for a caller that already excludes :meth:`catch_up` (the
        engine runs it only inside a cycle, under the baton the lean path holds): no lock."""
        mine = self._mine()
        cell = mine[2]
        cell[0] += 1
        return mine[1], cell[0]

    def next_digest_excluded(self, stem_digest: Callable[[str], int]) -> tuple[str, int, int]:
        """:meth:`next_count_excluded` with ``stem_digest(stem)`` as a third item, computed
        once per thread (the lean path hashes the name from its parts every call)."""
        mine = getattr(self._local, "mine", None)
        if mine is None or mine[4] is None or mine[3].name != mine[0]:  # (_mine's test, written out)
            mine = self._mine()
            mine = self._local.mine = (*mine[:4], stem_digest(mine[1]))
        cell = mine[2]
        n = cell[0] = cell[0] + 1
        return mine[1], n, mine[4]  # type: ignore[return-value]

    def _mine(self) -> tuple[str, str, list[int], threading.Thread, int | None]:
        mine: tuple[str, str, list[int], threading.Thread, int | None] | None = getattr(self._local, "mine", None)
        if mine is None or mine[3].name != mine[0]:  # first call in this thread, or it was renamed
            thread = threading.current_thread()
            mine = self._local.mine = (*self._claim(thread), thread, None)
        return mine

    def catch_up(self, name: str) -> None:
        """Count ``name``, another rank's unnamed request, as made here too.

        A rank waiting in ``join()`` never makes the unnamed calls the working ranks make
        meanwhile (it stands in for them, or they fail); without this its counters would
        lag theirs, and every later unnamed call would wait for a name no other rank uses.
        """
        if not name.startswith("#"):
            return
        label, _, count = name[1:].rpartition(".")
        if not count.isdigit():
            return
        label = label or "MainThread"
        with self._lock:
            cell = self._counters.setdefault(label, (None, [0]))[1]
            cell[0] = max(cell[0], int(count))

    def _claim(self, thread: threading.Thread) -> tuple[str, str, list[int]]:
        """Register ``thread`` under its name; a later thread of the same name, once this
        one has ended, continues the same count (as the other ranks' would)."""
        label = thread.name
        with self._lock:
            owner_ref, cell = self._counters.get(label, (None, [0]))
            owner = owner_ref() if owner_ref is not None else None
            if owner is not None and owner is not thread and owner.is_alive():
                raise ValueError(
                    f"two live threads are both named {label!r} and both submit unnamed collectives; "
                    "ranks match unnamed requests per thread name, so give the threads distinct "
                    "names (threading.Thread(name=...)) or pass name= to each collective"
                )
            self._counters[label] = (weakref.ref(thread), cell)
        return label, "#" if label == "MainThread" else f"#{label}.", cell


_manifests: dict[str, int] = {}
_manifests_lock = threading.Lock()


def manifest_name(prefix: str, manifest: object) -> str:
    """A request-name prefix for an object (an optimizer) from what every rank sees alike.

    ``manifest`` is what the object covers, equal on every rank that builds the same model
    (its parameters' names, shapes and dtypes): the name is ``prefix`` + a digest of it +
    how many objects over that same manifest this process made before. Two ranks that
    wrap the same models in the same order get the same names, even if one of them also
    wraps something else in between (a process-wide counter would then drift).

    Example:
        >>> manifest_name("ddl.torch.opt", [("w", (3,), "float32")])  # doctest: +ELLIPSIS
        'ddl.torch.opt.b...'
    """
    import hashlib

    digest = hashlib.blake2b(repr(manifest).encode(), digest_size=5).hexdigest()
    key = f"{prefix}.{digest}"
    with _manifests_lock:
        n = _manifests[key] = _manifests.get(key, -1) + 1
    return key if n == 0 else f"{key}.{n}"


_sites: dict[str, int] = {}


def call_site_name(prefix: str) -> str:
    """A request name from where the program called into ddl: ``prefix`` + the first calling
    frame outside ddl (file and line) + how many calls that line made before.

    For checks that must meet on every rank even when what they compare differs (a
    manifest name would then differ too): ranks running the same program call from the
    same line, whichever thread they run it on and whatever else they built before.
    """
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] == "ddl":
        frame = frame.f_back
    site = f"{prefix}@{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
    with _manifests_lock:
        n = _sites[site] = _sites.get(site, -1) + 1
    return f"{site}.{n}"


_labels: dict[str, str] = {}
#: At most this many labels are kept (a program that makes buckets without end forgets old ones).
_MAX_LABELS = 4096


def label(name: str, text: str) -> None:
    """Say what a request name stands for in the user's terms (an adapter's gradient
    bucket: its parameters), so errors and stall reports name it that way.

    Example:
        >>> label("ddl.torch.opt.ab12.b0", "gradients of fc.weight, fc.bias")
        >>> described("ddl.torch.opt.ab12.b0")
        "'ddl.torch.opt.ab12.b0' (gradients of fc.weight, fc.bias)"
    """
    with _manifests_lock:
        if len(_labels) >= _MAX_LABELS:
            _labels.clear()
        _labels[name] = text


def described(name: str) -> str:
    """``name`` quoted, with its :func:`label` where it has one."""
    text = _labels.get(name)
    return f"{name!r} ({text})" if text else repr(name)
