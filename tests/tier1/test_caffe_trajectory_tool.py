"""tools.caffe.trajectory: the numbers of a training log read alike from Caffe's and ddl-caffe's lines, and the
table marks a value only where ddl-caffe lies outside Caffe's own spread."""

from __future__ import annotations

from tools.caffe.trajectory import logged_values, table

CAFFE = """I1206 02:41:46.593372 20466 solver.cpp:347] Iteration 0, Testing net (#0)
I1206 02:41:46.6 20466 solver.cpp:414]     Test net output #0: accuracy = 0.124
I1206 02:41:46.6 20466 solver.cpp:414]     Test net output #1: loss = 2.57045 (* 1 = 2.57045 loss)
I1206 02:41:46.661299 20466 solver.cpp:239] Iteration 0 (-2.10195e-44 iter/s, 0.067s/20 iters), loss = 2.42274
I1206 02:41:46.661 20466 solver.cpp:258]     Train net output #0: loss = 2.42274 (* 1 = 2.42274 loss)
I1206 02:41:46.779485 20466 solver.cpp:239] Iteration 20 (169.492 iter/s, 0.118s/20 iters), loss = VALUE
"""


def test_caffe_and_ddl_logs_read_alike_and_only_an_outlier_is_marked() -> None:
    ddl = CAFFE.replace("solver.cpp", "solver.py").replace("(-2.10195e-44 iter/s", "(0 iter/s")
    got = logged_values(CAFFE.replace("VALUE", "2.0368"))
    assert got == [("it 0 test #0 accuracy", 0.124), ("it 0 test #1 loss", 2.57045), ("it 0 loss", 2.42274),
                   ("it 0 train #0 loss", 2.42274), ("it 20 loss", 2.0368)]
    runs = {"caffe A": CAFFE.replace("VALUE", "2.0"), "caffe B": CAFFE.replace("VALUE", "2.1"),
            "ddl-caffe": ddl.replace("VALUE", "2.05")}
    assert table(runs)[-1].endswith("on 0 (marked *)")
    runs["ddl-caffe"] = ddl.replace("VALUE", "2.3")          # 0.2 outside a range 0.1 wide
    lines = table(runs)
    assert lines[-2].startswith("it 20 loss") and lines[-2].endswith("*") and lines[-1].endswith("on 1 (marked *)")


def test_the_bench_gives_caffe_the_cpus_real_openblas_core() -> None:
    from pathlib import Path

    from tools.caffe.real_caffe import Peer, best_core

    assert best_core({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"}) == "SkylakeX"
    assert best_core({"avx2", "fma", "sse3"}) == "Haswell"
    assert best_core({"sse3"}) is None
    assert Peer(Path("/x"), core="SkylakeX").env(1)["OPENBLAS_CORETYPE"] == "SkylakeX"
    assert "OPENBLAS_CORETYPE" not in Peer(Path("/x")).env(2)
