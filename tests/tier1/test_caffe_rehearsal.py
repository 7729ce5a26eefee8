"""emulation.caffe_rehearsal and emulation.paced_caffe without hosts: a deploy net made trainable, the timing read
from ddl-caffe's display lines, the link scaled to DDL's compute : link ratio, and the pacing of compute."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmdb")

from emulation import caffe_rehearsal as rehearsal  # noqa: E402
from emulation.paced_caffe import Pacer  # noqa: E402

DEPLOY = """name: "tiny"
input: "data" input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8
layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 4 kernel_size: 3 bias_term: false weight_filler { type: "xavier" } } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" batch_norm_param { use_global_stats: true } }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "fc" type: "InnerProduct" bottom: "c" top: "fc" inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def test_a_deploy_net_is_made_trainable_and_its_gradients_counted(tmp_path: Path) -> None:
    (tmp_path / "deploy.prototxt").write_text(DEPLOY)
    net = rehearsal.trainable_net(str(tmp_path / "deploy.prototxt"), 3, tmp_path / "data")
    types = [lp.type for lp in net.layer]
    assert types == ["Data", "Convolution", "BatchNorm", "Scale", "InnerProduct", "SoftmaxWithLoss"]
    data = net.layer[0]
    assert data.data_param.batch_size == 3 and data.transform_param.crop_size == 8 and list(data.top) == ["data", "label"]
    assert not net.layer[2].batch_norm_param.HasField("use_global_stats")     # batch statistics: training
    # conv weight, scale and bias, fc weight and bias; not BatchNorm's statistics (lr_mult 0)
    assert rehearsal.gradient_sizes(net) == [4 * 3 * 9, 4, 4, 5 * 4 * 36, 5]
    solvers = rehearsal.write_solvers(net, tmp_path, 5, [True, False])
    assert "layer_wise_reduce: false" in solvers[False].read_text() and "display: 1" in solvers[True].read_text()


def test_iteration_times_come_from_the_display_lines_of_blocks_alone_and_together() -> None:
    lapses = [9.0, 5.0, 2.0, 7.0, 3.0, 3.0, 8.0, 2.2, 2.1, 9.0, 3.1, 3.2, 8.0, 2.0]   # blocks of 3, the first alone
    lines, at = [], 0.0
    for i, lapse in enumerate(lapses):
        at += lapse
        lines.append(f"I1206 03:{int(at // 60):02d}:{at % 60:09.6f} 42 solver.py:231] Iteration {i} (1 iter/s, "
                     f"{lapse}s/1 iters), loss = 6.9")
    log = "\n".join(lines)
    assert [it for _, it, _ in rehearsal.iterations(log)] == list(range(len(lapses)))
    alone, together = rehearsal.split_blocks(log, 3)
    # warm-up (0, 1) and each block's first iteration (0, 3, 6, 9, 12) left out
    assert alone == [2.0, 2.2, 2.1, 2.0] and together == [3.0, 3.0, 3.1, 3.2]
    assert rehearsal.steady_seconds(log) == pytest.approx(3.05)    # the median after the warm-up


def test_the_link_keeps_ddls_compute_to_link_ratio() -> None:
    from ddl_bench.rehearsal import REFERENCES, link_bound

    from ddl.tools.plan import parse_bandwidth

    ref = REFERENCES["ddl-p100"]
    nbytes = 97_500_000
    rate = rehearsal.link_rate(nbytes, 8, 10.0, "ddl-p100")
    here = 10.0 / link_bound(nbytes, 8, rate)
    there = ref.step_ms / 1e3 / link_bound(nbytes, ref.hosts, parse_bandwidth(ref.link))
    assert here == pytest.approx(there)
    assert rehearsal.auto_pace(16, 2) == 31 and rehearsal.auto_pace(1, 8) == 0


def test_the_pacer_stretches_compute_by_its_cpu_time_not_its_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from emulation import paced_caffe

    clock = {"cpu": 0.0, "wall": 0.0, "slept": 0.0}

    def sleep(seconds: float) -> None:
        clock["wall"] += seconds + 0.001          # every sleep wakes 1 ms late
        clock["slept"] += seconds

    monkeypatch.setattr(paced_caffe.time, "thread_time", lambda: clock["cpu"])
    monkeypatch.setattr(paced_caffe.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(paced_caffe.time, "sleep", sleep)
    pacer = Pacer(3.0, quantum=0.005)
    pacer.start(new_iteration=True)
    for _ in range(100):                        # 100 stretches of 1 ms CPU, each 2 ms of wall (a busy machine)
        clock["cpu"] += 0.001
        clock["wall"] += 0.002
        pacer.pause()
    pacer.pause(flush=True)
    # (3 + 1) x 100 ms of CPU = 400 ms, whatever the wall clock did; the sleeps' late wake-ups are paid back.
    assert clock["wall"] == pytest.approx(0.4, abs=0.002)
    assert clock["slept"] < 0.2 + 0.01          # 200 ms of the 400 were the stretches themselves
