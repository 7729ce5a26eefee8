"""Gradient buckets: which tensors reduce together, in the order backward produces them, and which the engine fuses.

One planner for the frameworks and for ``ddl plan``: ``ddl.torch`` builds its buckets
with :func:`gradient_buckets` (its defaults are :data:`FIRST_BUCKET_BYTES` and
:data:`BUCKET_BYTES`, its buffers carry :data:`FLAGS_PER_TENSOR` presence flags per
gradient), the engine groups the allreduces a cycle runs with :func:`fuse`, and
``ddl plan`` prices a step with both (:mod:`ddl.reduction.step_plan`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

MiB = 1 << 20
#: DDP's defaults: a small first bucket, so communication starts early, then 25 MiB.
FIRST_BUCKET_BYTES = 1 * MiB
BUCKET_BYTES = 25 * MiB
#: Elements a ``ddl.torch`` bucket reduces per gradient besides the gradient itself: a
#: dense-gradient flag and a sparse-gradient flag (``ddl.torch.buckets.Bucket``).
FLAGS_PER_TENSOR = 2
#: An in-place, contiguous allreduce at least this large runs on its own, in its own
#: memory: fusing it would copy it in and out to save one latency it does not notice.
SOLO_BYTES = 1 << 20


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


@dataclasses.dataclass(frozen=True)
class GradientBucket:
    """One bucket of gradients as it travels: its members, their elements and its flags.

    Attributes:
        members: parameter indices, in the order the bucket fills.
        elements: the gradients' elements.
        flags: presence-flag elements reduced with them.
        itemsize: bytes per element.
    """

    members: tuple[int, ...]
    elements: int
    flags: int
    itemsize: int

    @property
    def count(self) -> int:
        """Elements the bucket's allreduce reduces (gradients and flags)."""
        return self.elements + self.flags

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize


def gradient_buckets(numels: Sequence[int], itemsizes: Sequence[int], *, first_cap: int, cap: int,
                     kinds: Sequence[object] | None = None, order: Sequence[int] | None = None,
                     flags_per_tensor: int = FLAGS_PER_TENSOR) -> tuple[GradientBucket, ...]:
    """The buckets ``ddl.torch`` reduces for gradients of ``numels`` elements (parameter order).

    Without ``order``, from the last parameter back (the first step's plan); with the
    order the ranks agreed on after the first step, in that order, and the parameters no
    rank saw in buckets of their own after them (so the seen ones never wait for them).

    Args:
        kinds: what may share a bucket (dtype and device); default: the itemsize.

    Example:
        >>> [b.members for b in gradient_buckets([1, 1, 1], [4] * 3, first_cap=4, cap=8)]
        [(2,), (1, 0)]
        >>> [(b.members, b.count) for b in gradient_buckets([1, 1, 1], [4] * 3, first_cap=4, cap=8, order=[0])]
        [((0,), 3), ((2, 1), 6)]
    """
    sizes = [n * i for n, i in zip(numels, itemsizes, strict=True)]
    kinds = list(itemsizes) if kinds is None else list(kinds)
    if order is None:
        plan = plan_buckets(sizes, kinds, first_cap=first_cap, cap=cap)
    else:
        seen = set(order)
        rest = [i for i in reversed(range(len(sizes))) if i not in seen]
        plan = (plan_buckets(sizes, kinds, first_cap=first_cap, cap=cap, order=order)
                + plan_buckets(sizes, kinds, first_cap=cap, cap=cap, order=rest))
    return tuple(GradientBucket(tuple(members), sum(numels[i] for i in members), flags_per_tensor * len(members),
                                itemsizes[members[0]]) for members in plan)


@dataclasses.dataclass(frozen=True)
class FusionItem:
    """One allreduce as the engine's fusion sees it.

    Attributes:
        key: what must match to share a buffer (dtype, wire dtype, op, algorithm, scaling).
        nbytes: its bytes on the wire.
        solo: it may run on its own where it lies (in place, contiguous, sent as its own dtype).
    """

    key: Hashable
    nbytes: int
    solo: bool


def fuse(items: Sequence[FusionItem | None], threshold: int) -> list[list[int]]:
    """The engine's rule: which of a cycle's requests (in the agreed order) run together.

    ``None`` stands for a request that is no allreduce (it runs alone, where it stands).
    An allreduce that may run solo and is at least :data:`SOLO_BYTES` runs alone; the
    others join the open buffer of their key while it stays within ``threshold`` bytes,
    else open a new one. Groups are returned in the order they run (where their first
    request stood).

    Example:
        >>> small = FusionItem("f32", 1000, True)
        >>> fuse([small, None, small, FusionItem("f32", 2 << 20, True), small], 2500)
        [[0, 2], [1], [3], [4]]
    """
    groups: list[list[int]] = []
    open_: dict[Hashable, tuple[list[int], int]] = {}
    for i, item in enumerate(items):
        if item is None or (item.solo and item.nbytes >= SOLO_BYTES):
            groups.append([i])
            continue
        group = open_.get(item.key)
        if group is not None and group[1] + item.nbytes <= threshold:
            group[0].append(i)
            open_[item.key] = (group[0], group[1] + item.nbytes)
        else:
            members = [i]
            open_[item.key] = (members, item.nbytes)
            groups.append(members)
    return groups
