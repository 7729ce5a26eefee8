"""``python -m tools.caffe.bench --caffemodel NET``: writing and reading a zoo net's .caffemodel, each in a fresh process,
timed, with its peak memory beyond the net itself (ru_maxrss), beside the file size, ``cp`` writing a copy of the same
file (the machine's floor for writing that many bytes) and the same file written by protobuf."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]     # the checkout: children import tools.caffe from there

def child(name: str, path: str, what: str) -> dict[str, float]:
    """In a fresh process: build ``name`` and time one ``write``, ``write_protobuf`` or ``read`` of its .caffemodel."""
    import gc
    import resource
    import time

    from ddl.caffe.formats import schema
    from ddl.caffe.formats.protofile import parse_text, write_binary
    from ddl.caffe.net.net import Net
    from ddl.caffe.net.weights import load_weights
    from tools.caffe import zoo_nets

    net = Net(parse_text(zoo_nets.NETS[name](1), schema.NetParameter()), schema.TEST, quiet=True)
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if what == "write":
        net.save(path)
    elif what == "write_protobuf":
        write_binary(path, net.to_proto())
    else:
        load_weights(net, path)
    secs = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": secs, "extra_mb": (after - before) / 1024}


def copy_seconds(src: str, dst: str) -> float:
    """Seconds ``cp`` takes to write a copy of ``src`` (read from the page cache): this machine's floor for writing
    a file of that size, which no .caffemodel writer can go under."""
    import time

    Path(dst).unlink(missing_ok=True)
    t0 = time.perf_counter()
    subprocess.run(["cp", src, dst], check=True)
    secs = time.perf_counter() - t0
    Path(dst).unlink()
    return secs


def _child(name: str, path: str, what: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "tools.caffe.bench_files", name, path, what], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def measure(name: str, *, rounds: int = 2, protobuf: bool = False) -> dict[str, float]:
    """Median seconds and extra MB of writing and of reading ``name``'s .caffemodel (fresh processes, alternated)."""
    with tempfile.TemporaryDirectory(prefix="ddl-caffe-bench-") as tmp:
        path = str(Path(tmp) / f"{name}.caffemodel")
        writes, reads, copies = [], [], []
        for _ in range(rounds):
            writes.append(_child(name, path, "write"))
            reads.append(_child(name, path, "read"))
            copies.append(copy_seconds(path, path + ".cp"))
        size_mb = Path(path).stat().st_size / 2 ** 20
        res = {"file_mb": size_mb,
               "write_s": sorted(w["seconds"] for w in writes)[len(writes) // 2],
               "read_s": sorted(r["seconds"] for r in reads)[len(reads) // 2],
               "cp_s": sorted(copies)[len(copies) // 2],
               "write_extra_mb": max(w["extra_mb"] for w in writes),
               "read_extra_mb": max(r["extra_mb"] for r in reads)}
        if protobuf:
            pb = _child(name, path + ".pb", "write_protobuf")
            res["protobuf_write_s"], res["protobuf_write_extra_mb"] = pb["seconds"], pb["extra_mb"]
    res["write_over_read"] = res["write_s"] / res["read_s"]
    res["write_over_cp"] = res["write_s"] / res["cp_s"]
    res["write_extra_over_file"] = res["write_extra_mb"] / size_mb
    return res


if __name__ == "__main__":
    print(json.dumps(child(*sys.argv[1:4])))
