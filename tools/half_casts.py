"""The half-type kernels against a memory pass: ``python -m tools.half_casts [--elements N] [--rounds R]``.

Times what fp16 compression does to a bucket of N float32 gradients (default 4.73 M, the
``ddl bench torch`` MLP's), with numpy's kernels and with torch's (``ddl.torch``'s), beside
a plain float32 copy of the same bucket (one memory pass): pack (divide by the world size,
cast to float16), sum two float16 buffers, unpack (cast back). Gradients are drawn at
realistic sizes (|g| ~ 1e-5: mostly float16 subnormals). Contenders run in interleaved
rounds; the table gives each one's median in ms and ns per element, and its ratio to the copy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.half_casts", description=__doc__)
    parser.add_argument("--elements", type=int, default=4_730_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1e-5, help="the gradients' standard deviation")
    args = parser.parse_args(argv)

    import torch

    from ddl.base import kernels
    from ddl.torch.kernels import TORCH

    torch.set_num_threads(1)
    n = args.elements
    grads = (np.random.default_rng(0).standard_normal(n) * args.scale).astype(np.float32)
    wire, other, back, copy = np.empty(n, np.float16), np.empty(n, np.float16), np.empty(n, np.float32), np.empty_like(grads)
    np.copyto(other, grads, casting="unsafe")
    cases: dict[str, Callable[[], None]] = {"float32 copy (one memory pass)": lambda: np.copyto(copy, grads)}
    for k in (kernels.NUMPY, TORCH):
        cases[f"{k.name}: pack (divide by 2, cast to float16)"] = lambda k=k: k.divide(wire, grads, 2)  # type: ignore[misc]
        cases[f"{k.name}: float16 sum"] = lambda k=k: k.add(wire, other, wire)  # type: ignore[misc]
        cases[f"{k.name}: unpack (cast to float32)"] = lambda k=k: k.cast(back, other)  # type: ignore[misc]
    times: dict[str, list[float]] = {c: [] for c in cases}
    with np.errstate(all="ignore"):
        for f in cases.values():
            f()  # first touch
        for r in range(args.rounds):
            names = list(cases)
            names = names[r % len(names):] + names[: r % len(names)]
            for c in names:
                t0 = time.perf_counter()
                cases[c]()
                times[c].append(time.perf_counter() - t0)
    base = statistics.median(times["float32 copy (one memory pass)"])
    load = os.getloadavg()
    print(f"half-type kernels, {n} elements (|g| ~ {args.scale:g}), {args.rounds} interleaved rounds, one thread; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"| {'operation':<44} | {'ms':>8} | {'ns/element':>10} | {'x copy':>7} |")
    print(f"| {'-' * 44} | {'-' * 8} | {'-' * 10} | {'-' * 7} |")
    for c, v in times.items():
        t = statistics.median(v)
        print(f"| {c:<44} | {t * 1e3:8.2f} | {t / n * 1e9:10.2f} | {t / base:7.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
