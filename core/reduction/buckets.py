"""Gradient buckets: which tensors reduce together, in the order backward produces them.

One planner for the frameworks (``ddl.torch`` fills its buckets by it) and for
``ddl plan``, which prices the same buckets a training step would reduce.
"""

from __future__ import annotations

from collections.abc import Sequence

MiB = 1 << 20
#: DDP's defaults: a small first bucket, so communication starts early, then 25 MiB.
FIRST_BUCKET_BYTES = 1 * MiB
BUCKET_BYTES = 25 * MiB


def plan_buckets(
    nbytes: Sequence[int], kinds: Sequence[object], *, first_cap: int, cap: int,
    order: Sequence[int] | None = None,
) -> list[list[int]]:
    """Group parameter indices into buckets, DDP style.

    Buckets are filled in the order the gradients are expected to arrive: ``order``
    (indices, e.g. as observed in a first step; those it leaves out are skipped), or by
    default from the last parameter back, as backward roughly runs. The first bucket is
    small so its allreduce starts early; the rest close once the next parameter would
    pass ``cap`` bytes. Only parameters of one kind (dtype and device) share a bucket. A
    parameter larger than the cap gets a bucket of its own.

    Returns:
        Buckets in the order they are expected to fill, each a list of indices.

    Example:
        >>> plan_buckets([4, 4, 4], ["f32"] * 3, first_cap=4, cap=8)
        [[2], [1, 0]]
        >>> plan_buckets([4, 4, 4], ["f32"] * 3, first_cap=4, cap=8, order=[0, 2, 1])
        [[0], [2, 1]]
    """
    if len(nbytes) != len(kinds):
        raise ValueError(f"{len(nbytes)} sizes but {len(kinds)} kinds")
    if first_cap <= 0 or cap <= 0:
        raise ValueError(f"bucket caps must be positive, got first_cap={first_cap} and cap={cap}")
    sequence = list(reversed(range(len(nbytes)))) if order is None else list(order)
    if sorted(set(sequence)) != sorted(sequence) or any(not 0 <= i < len(nbytes) for i in sequence):
        raise ValueError(f"order must list distinct indices below {len(nbytes)}, got {sequence}")
    position = {i: n for n, i in enumerate(sequence)}
    done: list[list[int]] = []
    open_: dict[object, tuple[list[int], int]] = {}
    for i in sequence:
        kind = kinds[i]
        members, size = open_.get(kind, ([], 0))
        limit = first_cap if not done else cap
        if members and size + nbytes[i] > limit:
            done.append(members)
            members, size = [], 0
        members.append(i)
        open_[kind] = (members, size + nbytes[i])
    leftover = [m for m, _ in open_.values() if m]
    # Leftover buckets are ordered by when their first parameter arrives.
    done.extend(sorted(leftover, key=lambda m: position[m[0]]))
    return done
