"""The engine's errors, worded: what each rank raises when a cycle cannot run together.

Pure functions of the agreed verdict and this rank's requests, so the engine's cycle
code reads as decisions and these read as messages (the tests pin their wording).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ddl.base.errors import HorovodInternalError, MismatchError, RankLeftError, RemoteError
from ddl.engine import codec, naming
from ddl.engine.fusion import Request


def leaving(rank: str, why: int) -> str:
    """How rank ``rank`` (described) left, from its :data:`~ddl.engine.codec.STOP` word."""
    if why == codec.STOP_FAILED:
        return f"{rank} left after an uncaught exception (its traceback is in its output)"
    return f"{rank} left: its program is ending (its last line, sys.exit or ddl.shutdown)"


def rank_left(batch: Sequence[Request], left: Sequence[tuple[int, int]], describe: Callable[[int], str],
              me: int, compact: bool) -> RankLeftError:
    """The error for every request of ``batch`` when ranks ``left`` (rank, why) are leaving
    while this rank ``me`` holds it: none of it can ever run."""
    who = "; ".join(leaving(describe(q), why) for q, why in left[:4])
    if len(left) > 4:
        who += f" (and {len(left) - 4} more ranks)"
    if len(left) == 1 and compact:
        who += " (the lowest-numbered rank that left; others may have too)"
    names = ", ".join(f"{r.kind} {naming.described(r.name)}" for r in batch[:3])
    if len(batch) > 3:
        names += f" and {len(batch) - 3} more"
    text = (f"{who}, while rank {me} waits for it in {names}: it will never take part, so "
            f"{'this call fails' if len(batch) == 1 else 'these calls fail'} here at once")
    return RankLeftError(text, ranks=[q for q, _ in left])


def not_run_together(req: Request, failing: tuple[int, ...], message: str, rank: int) -> BaseException:
    """This rank's error for a request the ranks could not run together."""
    if rank in failing and req.error is not None:
        return req.error  # the rank whose arguments were refused raises its own error
    if failing:
        return RemoteError(f"collective {req.name!r}: {message}")
    return MismatchError(f"tensor {req.name!r}: {message}")


def from_mpi(exc: BaseException) -> bool:
    """Whether the MPI library raised ``exc`` (mpi4py's ``MPI.Exception``), not ddl or the program."""
    return type(exc).__module__.startswith("mpi4py")


def peer_lost(world: int, exc: BaseException) -> HorovodInternalError:
    """An elastic world's collective failed in MPI: a peer was lost (Horovod's rule)."""
    return HorovodInternalError(f"a collective failed in elastic world {world} ({type(exc).__name__}: {exc}); "
                                "elastic.run restores the last commit and the next world resumes from it")


def engine_failed(rank: int, calls: Sequence[str], exc: BaseException) -> str:
    """The line a rank prints before it aborts the job: its cycle (the collectives named
    ``calls``) failed after the ranks agreed."""
    names = ", ".join(repr(name) for name in calls[:5]) or "(none pending)"
    return (f"ddl: rank {rank}: the engine failed during a collective ({names}): {type(exc).__name__}: {exc}; "
            "the other ranks cannot finish it, so the job is aborted\n")
