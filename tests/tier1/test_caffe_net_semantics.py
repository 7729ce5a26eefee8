"""Net and solver semantics: propagate_down, force_backward, net state stages, test nets per test_iter, HDF5 snapshots,
settings refused before iteration 0, ignored fields, and ``time`` adding up in branching nets."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("h5py")

from ddl.caffe.command import cli  # noqa: E402
from ddl.caffe.formats import protofile, schema  # noqa: E402
from ddl.caffe.layers.base import LayerError  # noqa: E402
from ddl.caffe.net.layer_timing import LayerRunner, time_net  # noqa: E402
from ddl.caffe.net.net import Net  # noqa: E402
from ddl.caffe.solver.lr_policy import LrPolicyError  # noqa: E402
from ddl.caffe.solver.solver import Solver  # noqa: E402

BRANCHY = """
name: "branchy"
layer { name: "in" type: "Input" top: "x" top: "label" input_param { shape { dim: 4 dim: 3 dim: 8 dim: 8 } shape { dim: 4 } } }
layer { name: "c1" type: "Convolution" bottom: "x" top: "c1" convolution_param { num_output: 6 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "a" type: "Convolution" bottom: "c1" top: "a" PD_A convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "b" type: "Convolution" bottom: "c1" top: "b" convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" top: "cat" }
layer { name: "ip" type: "InnerProduct" bottom: "cat" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def _net(text: str, phase: int = schema.TRAIN, **kw: object) -> Net:
    net = Net(protofile.parse_text(text, schema.NetParameter()), phase, quiet=True, **kw)  # type: ignore[arg-type]
    cli.generate_inputs(net, torch.Generator().manual_seed(0))
    return net


def test_propagate_down_false_stops_the_gradient() -> None:
    free = _net(BRANCHY.replace("PD_A", ""))
    cut = _net(BRANCHY.replace("PD_A", "propagate_down: false"))
    cut.layer_by_name("c1").blobs[0].data.copy_(free.layer_by_name("c1").blobs[0].data)   # type: ignore[union-attr]
    for src, dst in zip(free.params, cut.params, strict=True):
        dst.tensor.data.copy_(src.tensor.data)
    for net in (free, cut):
        loss, _ = net.forward()
        loss.backward()
    g_free = free.layer_by_name("c1").blobs[0].grad           # type: ignore[union-attr]
    g_cut = cut.layer_by_name("c1").blobs[0].grad             # type: ignore[union-attr]
    assert g_free is not None and g_cut is not None
    assert not torch.allclose(g_free, g_cut)                  # ignoring propagate_down would make them equal
    # With "a" cut off, c1's gradient is what flows through "b" alone.
    cut_b = _net(BRANCHY.replace("PD_A", "").replace('bottom: "c1" top: "b"', 'bottom: "c1" top: "b" propagate_down: false'))
    for src, dst in zip(free.params, cut_b.params, strict=True):
        dst.tensor.data.copy_(src.tensor.data)
    loss, _ = cut_b.forward()
    loss.backward()
    g_b = cut_b.layer_by_name("c1").blobs[0].grad             # type: ignore[union-attr]
    torch.testing.assert_close(g_cut + g_b, g_free, rtol=1e-4, atol=1e-6)
    with pytest.raises(LayerError, match="propagate_down must be given 0 or 1 times"):
        _net(BRANCHY.replace("PD_A", "propagate_down: false propagate_down: true"))


def test_force_backward_gives_input_diffs_and_lr_mult_zero_gives_none() -> None:
    text = BRANCHY.replace("PD_A", "").replace('name: "branchy"', 'name: "branchy" force_backward: true')
    net = _net(text)
    loss, blobs = net.forward()
    loss.backward()
    assert blobs["x"].grad is not None and float(blobs["x"].grad.abs().sum()) > 0
    assert blobs["label"].grad is None or float(blobs["label"].grad.abs().sum()) == 0
    plain = _net(BRANCHY.replace("PD_A", "param { lr_mult: 0 }"))
    loss, blobs = plain.forward()
    loss.backward()
    assert blobs["x"].grad is None
    assert plain.layer_by_name("a").blobs[0].grad is None     # type: ignore[union-attr]



def test_backward_needs_follow_caffes_analysis_with_blobs_read_twice_and_in_place() -> None:
    # Caffe splits a blob read by several layers and skips it only when every reader does: "ip" read by an
    # Accuracy (no backward) and by the loss still needs its diff; an in-place ReLU's bottom is judged by the
    # readers of its own version; what reaches no loss needs nothing; force_backward needs everything it can.
    text = BRANCHY.replace("PD_A", "").replace(
        'layer { name: "loss"', 'layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" }\n'
        'layer { name: "relu" type: "ReLU" bottom: "c1" top: "c1" }\n'
        'layer { name: "side" type: "InnerProduct" bottom: "c1" top: "side" inner_product_param { num_output: 2 } }\n'
        'layer { name: "loss"')
    for phase in (schema.TRAIN, schema.TEST):
        net = _net(text, phase)
        layer_need, bottom_need = net.backward_needs()
        need = dict(zip([la.name for la in net.layers], zip(layer_need, bottom_need, strict=True), strict=True))
        assert need["ip"] == (True, [True]) and need["acc"] == (False, [False, False]) and need["loss"] == (True, [True, False])
        assert need["relu"] == (False, [False]) and need["side"] == (False, [False])     # nothing under a loss reads them
        assert need["c1"] == (True, [False]) and need["in"] == (False, [])
    forced = _net(text.replace('name: "branchy"', 'name: "branchy" force_backward: true'))
    layer_need, bottom_need = forced.backward_needs()
    assert all(layer_need) and bottom_need[[la.name for la in forced.layers].index("c1")] == [True]

def test_net_state_stages_from_the_file_and_the_caller() -> None:
    text = ('name: "s" state { stage: "deploy" }\n'
            'layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 } } }\n'
            'layer { name: "d" type: "ReLU" bottom: "x" top: "d" include { stage: "deploy" } }\n'
            'layer { name: "t" type: "TanH" bottom: "x" top: "t" exclude { stage: "deploy" } }\n'
            'layer { name: "q" type: "Sigmoid" bottom: "x" top: "q" include { stage: "deploy" stage: "quant" } }\n')
    assert [la.name for la in _net(text).layers] == ["in", "d"]
    assert [la.name for la in _net(text, stages=("quant",)).layers] == ["in", "d", "q"]
    assert [la.name for la in _net(text.replace('state { stage: "deploy" }', "")).layers] == ["in", "t"]


NET = """
name: "tiny"
layer { name: "d" type: "DummyData" top: "x" top: "label" dummy_data_param { shape { dim: 4 dim: 5 } shape { dim: 4 }
        data_filler { type: "gaussian" } data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip" top: "ip2" include { stage: "two" } inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def _solver(tmp: Path, extra: str) -> Path:
    (tmp / "net.prototxt").write_text(NET)
    s = tmp / "solver.prototxt"
    s.write_text(f'net: "{tmp / "net.prototxt"}" base_lr: 0.1 lr_policy: "fixed" momentum: 0.9 max_iter: 6 random_seed: 3 '
                 f'snapshot_prefix: "{tmp / "snap"}" {extra}')
    return s


def test_one_test_net_per_test_iter_with_their_states(tmp_path: Path) -> None:
    sp = protofile.read_solver(_solver(tmp_path, 'test_iter: 2 test_iter: 3 test_interval: 3 test_state { stage: "one" } test_state { stage: "two" }'))
    solver = Solver(sp)
    assert len(solver.test_nets) == 2
    assert [la.name for la in solver.test_nets[1].layers] == ["d", "ip", "ip2", "loss"]
    assert "ip2" not in [la.name for la in solver.test_nets[0].layers]
    with pytest.raises(protofile.CaffeFormatError, match="2 test_state entries for 3 test nets"):
        Solver(protofile.read_solver(_solver(tmp_path, 'test_iter: 1 test_iter: 1 test_iter: 1 test_interval: 3 test_state { } test_state { }')))


def test_hdf5_snapshots_and_resume_match_an_uninterrupted_run(tmp_path: Path) -> None:
    whole = Solver(protofile.read_solver(_solver(tmp_path, "snapshot_format: HDF5 snapshot_after_train: false")))
    whole.solve()
    half = Solver(protofile.read_solver(_solver(tmp_path, "snapshot: 3 snapshot_format: HDF5 snapshot_after_train: false")))
    half.sp.max_iter = 3
    half.solve()
    state = tmp_path / "snap_iter_3.solverstate.h5"
    assert state.exists() and (tmp_path / "snap_iter_3.caffemodel.h5").exists()
    resumed = Solver(protofile.read_solver(_solver(tmp_path, "snapshot_format: HDF5 snapshot_after_train: false")))
    resumed.solve(str(state))
    for a, b in zip(whole.params, resumed.params, strict=True):
        assert torch.equal(a.tensor, b.tensor)
    with pytest.raises(protofile.CaffeFormatError, match="not a Caffe HDF5 solver state|cannot read"):
        resumed.restore(str(tmp_path / "snap_iter_3.caffemodel.h5"))


@pytest.mark.parametrize(("extra", "error", "match"), [
    ('regularization_type: "L3"', protofile.CaffeFormatError, "regularization_type 'L3'"),
    ('lr_policy: "plateau"', LrPolicyError, "lr_policy 'plateau' is unknown"),
    ('test_iter: 2', protofile.CaffeFormatError, "no positive test_interval"),
    ('snapshot: 2 snapshot_prefix: "/proc/nope/x"', protofile.CaffeFormatError, "cannot write snapshots"),
    ('type: "Adamax"', ValueError, "solver type 'Adamax' is unknown"),
])
def test_misconfigured_solvers_fail_before_iteration_0(tmp_path: Path, extra: str, error: type, match: str) -> None:
    path = _solver(tmp_path, "")
    text = path.read_text().replace('lr_policy: "fixed"', "") if "lr_policy" in extra else path.read_text()
    if "snapshot_prefix" in extra:
        text = re.sub(r'snapshot_prefix: "[^"]*"', "", text)
    path.write_text(text + " " + extra)
    started = []
    with pytest.raises(error, match=match):
        Solver(protofile.read_solver(path)).solve(on_iter=started.append)
    assert started == []


def test_fields_caffe_ignores_warn_once_and_unknown_types_are_listed(caplog: pytest.LogCaptureFixture) -> None:
    text = ('layer { name: "data" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 } } image_data_param { source: "x" } }\n'
            'layer { name: "r" type: "ReLU" bottom: "x" top: "y" pooling_param { pool: AVE } }\n')
    with caplog.at_level(logging.WARNING, logger="ddl.caffe"):
        _net(text)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "layer 'data' (Input): image_data_param" in warnings[0] and "layer 'r' (ReLU): pooling_param" in warnings[0]


def test_time_adds_up_in_branching_nets_and_runs_backward_on_deploy_nets(caplog: pytest.LogCaptureFixture) -> None:
    net = _net(BRANCHY.replace("PD_A", ""))
    torch.set_num_threads(1)
    # The parts never exceed the whole; that they cover at least half of it can fail once on
    # a loaded machine (a preemption lands between two layers' clocks), never three times.
    shares = []
    for _ in range(3):
        out = time_net(net, 3)
        assert out["forward_ms"] + out["backward_ms"] <= out["total_ms"] * 1.1
        shares.append((out["forward_ms"] + out["backward_ms"]) / out["total_ms"])
        if shares[-1] >= 0.5:
            break
    assert max(shares) >= 0.5, shares
    deploy = _net(BRANCHY.replace("PD_A", "").split('layer { name: "loss"')[0])
    with caplog.at_level(logging.INFO, logger="ddl.caffe"):
        d = time_net(deploy, 2)
    assert d["backward_ms"] > 0                               # Caffe runs every layer's backward here too
    back = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\s*(\w+)\tbackward: ([\d.e+-]+) ms", "\n".join(r.getMessage() for r in caplog.records), re.M)}
    assert back["c1"] > 0 and back["ip"] > 0


INCEPTION = """
name: "inception"
layer { name: "in" type: "Input" top: "x" top: "label" input_param { shape { dim: 8 dim: 8 dim: 16 dim: 16 } shape { dim: 8 } } }
BRANCHES
layer { name: "cat" type: "Concat" bottom: "b0" bottom: "b1" bottom: "b2" bottom: "b3" top: "cat" }
layer { name: "ip" type: "InnerProduct" bottom: "cat" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
""".replace("BRANCHES", "\n".join(
    f'layer {{ name: "c{i}" type: "Convolution" bottom: "x" top: "c{i}" convolution_param {{ num_output: 16 kernel_size: {2 * i + 1} pad: {i} weight_filler {{ type: "xavier" }} }} }}\n'
    f'layer {{ name: "r{i}" type: "ReLU" bottom: "c{i}" top: "b{i}" }}' for i in range(4)))


def test_time_spans_of_parallel_branches_do_not_overlap() -> None:
    net = _net(INCEPTION.replace('name: "inception"', 'name: "inception" force_backward: true'))
    runner = LayerRunner(net)
    n = len(net.layers)
    for _ in range(3):
        bwd = [0.0] * n
        runner.iteration([0.0] * n, bwd)
        # Four branches become ready together; counted from "ready", their spans would add up to
        # several times the pass.
        assert sum(bwd) <= runner.backward_seconds * 1.0001
        assert sum(bwd) >= runner.backward_seconds * 0.5
    assert all(bwd[i] > 0 for i, la in enumerate(net.layers) if la.type == "Convolution")


def test_gpu_flag_is_accepted(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ddl.caffe"):
        dev = cli.device_for("0")
    if torch.cuda.is_available():
        assert dev.type == "cuda"
    else:
        assert dev.type == "cpu" and "no CUDA device" in caplog.text
    assert cli.device_for(None).type == "cpu"
    args = cli._parser().parse_args(["time", "-model", "m.prototxt", "-gpu", "0"])
    assert args.gpu == "0"


def test_commands_keep_freed_memory_for_reuse() -> None:
    import subprocess
    import sys
    code = ("import resource, sys, numpy as np\nfrom ddl.caffe.command.memory import reuse_freed_memory\n"
            "ok = reuse_freed_memory() if sys.argv[1] == 'reuse' else True\n"
            "a = np.ones(1 << 26, np.uint8); del a\n"
            "f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt; b = np.ones(1 << 26, np.uint8)\n"
            "print(ok, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)")

    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True).stdout.split()
        assert out[0] == "True"
        return int(out[1])
    assert faults("reuse") < 50             # the freed 64 MB come back as they were
    assert faults("default") > 100          # glibc's default: fresh pages, faulted in again


def test_a_bottom_whose_maker_a_stage_rule_leaves_out_names_the_rule() -> None:
    parse_text = protofile.parse_text
    net = parse_text("""
        layer { name: "d" type: "DummyData" top: "x" include { phase: TEST stage: "on-train" } dummy_data_param { shape { dim: 2 dim: 3 } } }
        layer { name: "f" type: "Flatten" bottom: "x" top: "y" }""", schema.NetParameter())
    with pytest.raises(LayerError, match=r"left out by their rules .*stages none\): 'd' include \{ phase: TEST stage: \"on-train\" \}"):
        Net(net, schema.TEST, quiet=True)
    with pytest.raises(LayerError, match="is not produced by any earlier layer$"):       # no maker at all: no rule to name
        Net(parse_text('layer { name: "f" type: "Flatten" bottom: "z" top: "y" }', schema.NetParameter()), schema.TEST, quiet=True)
    assert Net(net, schema.TEST, quiet=True, stages=("on-train",)).shapes["y"] == (2, 3)


def test_outputs_are_numbered_in_caffes_order_of_blob_names(caplog: pytest.LogCaptureFixture) -> None:
    # The loss layer comes first, yet Caffe numbers outputs by its std::set of names: accuracy #0, loss #1; a loss
    # layer's anonymous top is no output at all.
    text = BRANCHY.replace("PD_A", "") + ('layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy" }\n'
                                          'layer { name: "aux" type: "EuclideanLoss" bottom: "ip" bottom: "ip" }\n')
    with caplog.at_level(logging.INFO, logger="ddl.caffe"):
        net = Net(protofile.parse_text(text, schema.NetParameter()), schema.TEST)
    assert net.outputs == ["accuracy", "loss"]
    assert "This network produces output accuracy" in caplog.text
    cli.generate_inputs(net, torch.Generator().manual_seed(0))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ddl.caffe"):
        Solver._log_outputs(None, "Test", net, [[0.5], [1.25]])  # type: ignore[arg-type]
    assert [r.getMessage() for r in caplog.records] == ["    Test net output #0: accuracy = 0.5",
                                                        "    Test net output #1: loss = 1.25 (* 1 = 1.25 loss)"]
