"""Gradient buckets: which parameters reduce together, and the flat buffer each one fills."""

from __future__ import annotations

from collections.abc import Sequence

import torch

MiB = 1 << 20


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


class Bucket:
    """One bucket: its parameters, their offsets in one flat buffer, and a presence flag each.

    The buffer holds every gradient followed by one flag per parameter (1 where this
    rank has a gradient, else 0). Reduced with the gradients, a flag above zero says some
    rank had one, so a parameter unused everywhere keeps ``grad=None`` as it would in a
    single process, and one unused only here still gets the others' gradient.
    """

    def __init__(self, index: int, name: str, params: list[torch.Tensor]) -> None:
        self.index = index
        self.name = name
        self.params = params
        self.offsets: list[int] = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total
        first = params[0]
        pin = first.device.type == "cuda"
        self.buffer = torch.zeros(total + len(params), dtype=first.dtype, pin_memory=pin)
        self.ready = 0
        self.handle: object | None = None

    def grad_slice(self, j: int) -> torch.Tensor:
        """The part of the buffer holding parameter ``j``'s gradient, shaped like it."""
        p = self.params[j]
        return self.buffer[self.offsets[j] : self.offsets[j] + p.numel()].view(p.shape)

    @property
    def flags(self) -> torch.Tensor:
        return self.buffer[self.numel :]

    def reset(self) -> None:
        self.ready = 0
        self.handle = None
