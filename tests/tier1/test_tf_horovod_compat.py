"""Tier 1: what Horovod's TF tests expect of ddl.tensorflow: Session graphs, error classes (eager and
in graphs, with and without the status op), Compression, IndexedSlices refusals, in-place broadcasts
in graphs, local gradient sources and the Keras optimizer's compute_gradients."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import ddl  # noqa: E402
import ddl.tensorflow as dtf  # noqa: E402
import ddl.tensorflow.keras as dk  # noqa: E402
from ddl.tensorflow import status_op  # noqa: E402
from ddl.tensorflow.bridge import graph_name, host_call  # noqa: E402
from ddl.tensorflow.errors import CollectiveArgumentError, CollectiveMismatchError, as_tf_errors  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def world() -> None:
    ddl.init()


def _collective_ops(graph: tf.Graph) -> list[tf.Operation]:
    return [op for op in graph.get_operations() if op.type == "PyFunc" and op.name.startswith("ddl_")]


def test_session_graph_runs_collectives_in_trace_order() -> None:
    # A Session may start ready ops in any order; ranks must not pick different ones first.
    with tf.Graph().as_default() as graph:
        xs = [tf.ones([3]) * i for i in range(4)]
        outs = [dtf.allreduce(x, op=ddl.Sum) for x in xs] + [dtf.allgather(xs[0])]
        ops = _collective_ops(graph)
        assert len(ops) == 5
        for before, after in zip(ops, ops[1:], strict=False):  # each waits for the one before (its status)
            assert any(c is before or before.outputs[0] in c.inputs for c in after.control_inputs)
        with tf.compat.v1.Session() as sess:
            got = sess.run(outs)
    for i, g in enumerate(got[:4]):
        np.testing.assert_array_equal(g, np.full(3, float(i)))


def test_tf_function_graphs_are_left_to_automatic_control_dependencies() -> None:
    @tf.function
    def f(x: tf.Tensor) -> tf.Tensor:
        a = dtf.allreduce(x, op=ddl.Sum)
        b = dtf.allreduce(x * 2, op=ddl.Sum)
        ops = _collective_ops(tf.compat.v1.get_default_graph())
        assert all(not set(ops) & set(op.control_inputs) for op in ops)
        return a + b

    np.testing.assert_array_equal(f(tf.ones(2)), np.full(2, 3.0))


def test_graph_names_do_not_depend_on_shapes_or_dtypes() -> None:
    # Ranks tracing different shapes must meet under one name, so the engine reports the mismatch.
    with tf.Graph().as_default():
        a = graph_name("allgather", None, tf.ones([17, 10]))
        b = graph_name("allgather", None, tf.ones([17, 20], tf.int32))
    # "ddl.tf.allgather.<digest>[.<how many before>]": the digest must be the same.
    assert a.split(".")[:4] == b.split(".")[:4] and a != b
    assert graph_name("allgather", "mine", tf.ones([1])) == "mine"


def test_mismatch_is_horovods_failed_precondition_and_still_ddls() -> None:
    def refuse() -> None:
        raise ddl.MismatchError("rank 0: allreduce((3,), float32); rank 1: allreduce((4,), float32)")

    with pytest.raises(tf.errors.FailedPreconditionError, match=r"rank 1: allreduce\(\(4,\)") as info:
        as_tf_errors(refuse)()
    assert isinstance(info.value, ddl.MismatchError) and isinstance(info.value, RuntimeError)
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, CollectiveMismatchError) and again.message == info.value.message
    with pytest.raises(ValueError, match="other errors pass"):
        as_tf_errors(lambda: (_ for _ in ()).throw(ValueError("other errors pass")))()


def test_bad_arguments_are_horovods_invalid_argument_and_still_value_errors() -> None:
    with pytest.raises(tf.errors.InvalidArgumentError, match="summing to the first dimension 3") as info:
        dtf.alltoall(tf.ones([3]), splits=[5])
    assert isinstance(info.value, ValueError) and isinstance(info.value, CollectiveArgumentError)


def test_compression_compresses_floats_and_passes_the_rest() -> None:
    for dtype in (tf.float16, tf.float32, tf.float64):
        small, ctx = dtf.Compression.fp16.compress(tf.ones([3], dtype))
        assert small.dtype == tf.float16
        back = dtf.Compression.fp16.decompress(small, ctx)
        assert back.dtype == dtype and back.numpy().tolist() == [1, 1, 1]
    ints, ctx = dtf.Compression.fp16.compress(tf.ones([2], tf.int32))
    assert ints.dtype == tf.int32 and dtf.Compression.fp16.decompress(ints, ctx).dtype == tf.int32
    assert dtf.Compression.none.compress(tf.ones([1]))[1] is None
    # The collectives take them as the core's wire compression.
    summed = dtf.allreduce(tf.constant([1.5, 2.0]), op=ddl.Sum, compression=dtf.Compression.fp16)
    assert summed.dtype == tf.float32 and summed.numpy().tolist() == [1.5, 2.0]


def test_horovods_util_helper_is_there() -> None:
    from ddl.tensorflow.util import _executing_eagerly

    assert dtf._executing_eagerly is _executing_eagerly and _executing_eagerly() is True


def _refuse(_: np.ndarray) -> list[np.ndarray]:
    raise ddl.MismatchError("rank 0: allreduce((3,), float32); rank 1: allreduce((4,), float32)")


def _bad(_: np.ndarray) -> list[np.ndarray]:
    raise ValueError("splits must sum to 3")


def _run_in_session(fn: object) -> None:
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        sess.run(host_call(fn, [tf.ones([3])], [tf.float32], [[3]], what="t"))  # type: ignore[arg-type]


def test_graph_errors_keep_horovods_classes_through_the_status_op() -> None:
    # TF's PyFunc would report a mismatch as UnknownError; Horovod's tests expect FailedPrecondition.
    if status_op.find_compiler() is None:
        pytest.skip("no C++ compiler: the fallback test covers this machine")
    status_op.build(quiet=True)  # as scripts/setup-env.sh does (load() never compiles)
    assert status_op.load() is not None, status_op.why_not()
    with pytest.raises(tf.errors.FailedPreconditionError, match=r"rank 1: allreduce\(\(4,\)"):
        _run_in_session(_refuse)
    with pytest.raises(tf.errors.InvalidArgumentError, match="splits must sum to 3"):
        _run_in_session(_bad)
    f = tf.function(lambda x: host_call(_refuse, [x], [tf.float32], [[3]], what="t"))
    with pytest.raises(tf.errors.FailedPreconditionError, match="rank 1"):
        f(tf.ones([3]))
    # A good call passes its results through unchanged, with their static shapes.
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        out = host_call(lambda a: [a * 2, np.int64(7)], [tf.ones([3])], [tf.float32, tf.int64], [[3], []],
                        what="t")
        assert out[0].shape == (3,) and [op.type for op in tf.compat.v1.get_default_graph().get_operations()
                                         ].count("DdlCheckStatus") == 1
        got = sess.run(out)
    assert got[0].tolist() == [2.0, 2.0, 2.0] and got[1] == 7


def test_the_status_op_passes_tensors_or_fails_with_the_code() -> None:
    if status_op.find_compiler() is None:
        pytest.skip("no C++ compiler")
    status_op.build(quiet=True)
    check = status_op.load()
    assert check is not None, status_op.why_not()
    a, b = tf.constant([1.5, 2.5]), tf.constant([[1, 2]], tf.int64)
    out = check(0, "", [a, b])
    assert out[0].numpy().tolist() == [1.5, 2.5] and out[1].numpy().tolist() == [[1, 2]]
    with pytest.raises(tf.errors.FailedPreconditionError, match="ranks disagree"):
        check(int(tf.errors.FAILED_PRECONDITION), "ranks disagree", [a])
    with pytest.raises(tf.errors.InternalError, match="no such code"):
        check(12345, "no such code", [a])


def test_without_the_status_op_graph_errors_are_unknown_with_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fallback where no compiler is installed: the class is TF's, the message is ours.
    monkeypatch.setattr(status_op, "load", lambda: None)
    with pytest.raises(tf.errors.UnknownError, match=r"rank 1: allreduce\(\(4,\)"):
        _run_in_session(_refuse)
    with pytest.raises(tf.errors.InvalidArgumentError, match="splits must sum to 3"):
        _run_in_session(_bad)
    with tf.Graph().as_default() as graph:
        host_call(lambda a: [a], [tf.ones([1])], [tf.float32], [[1]], what="t")
        assert "DdlCheckStatus" not in [op.type for op in graph.get_operations()]


def test_loading_the_status_op_never_compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler run inside a user's first model.fit would be a surprise: where the library is
    not built, load() falls back and says how to build it."""
    monkeypatch.setattr(status_op, "DEFAULT_CACHE", tmp_path)
    monkeypatch.setattr(status_op, "_loaded", [])
    assert status_op.load() is None
    assert "python -m ddl.tensorflow.status_op" in status_op.why_not()
    assert list(tmp_path.iterdir()) == []


def test_status_op_build_says_why_not(tmp_path: object) -> None:
    with pytest.raises(status_op.BuildError, match="did not run"):
        status_op.build(tmp_path, compiler="/nonexistent/c++", quiet=True)  # type: ignore[arg-type]
    one = status_op.library_name(b"src", "2.21.0", ["-I/a"])
    assert one.endswith(".so") and "2.21.0" in one
    assert one != status_op.library_name(b"src", "2.20.0", ["-I/a"]) != status_op.library_name(b"src2", "2.21.0",
                                                                                                 ["-I/a"])
    cmd = status_op.build_command("c++", status_op.SOURCE, tmp_path / "x.so", ["-I/inc"], ["-l:tf"])  # type: ignore[operator]
    assert cmd[0] == "c++" and "-shared" in cmd and cmd.index("-I/inc") < cmd.index("-l:tf")


@pytest.mark.parametrize("op", ["Min", "Max", "Product", "Adasum"])
def test_indexed_slices_refuse_other_ops_with_horovods_class(op: str) -> None:
    sl = tf.IndexedSlices(tf.ones((1, 3)), tf.constant([0]))
    with pytest.raises(NotImplementedError, match="IndexedSlices"):
        dtf.allreduce(sl, op=getattr(ddl, op))
    with pytest.raises(NotImplementedError, match="IndexedSlices"):
        dtf.grouped_allreduce([tf.ones(2), sl], op=getattr(ddl, op))


def test_indexed_slices_refuse_scale_factors_before_any_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    import ddl.tensorflow.mpi_ops as ops

    monkeypatch.setattr(ops, "allgather", lambda *a, **k: pytest.fail("no collective may start"))
    sl = tf.IndexedSlices(tf.ones((1, 3), tf.int32), tf.constant([0]))
    for kwargs in ({"prescale_factor": 0.5}, {"postscale_factor": 2.0}):
        with pytest.raises(NotImplementedError, match="prescale_factor and postscale_factor"):
            dtf.allreduce(sl, op=ddl.Sum, **kwargs)  # type: ignore[arg-type]


def test_in_place_broadcast_in_a_session_graph_assigns(monkeypatch: pytest.MonkeyPatch) -> None:
    # In a TF 1 graph an assignment only happens when something depends on it.
    import ddl.tensorflow.tape as tape

    monkeypatch.setattr(tape.api, "broadcast", lambda a, root, **k: np.full_like(a, 7))  # the root's bytes
    seven = np.full(2, 7, np.uint8)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        v = tf.compat.v1.Variable(tf.zeros([2], tf.uint8), use_resource=True)
        w = tf.compat.v1.Variable(tf.ones([2], tf.uint8), use_resource=False)  # a TF 1 reference variable
        sess.run(tf.compat.v1.global_variables_initializer())
        new_v, new_w = dtf.broadcast_([v, w], root_rank=0)
        np.testing.assert_array_equal(sess.run(new_v), seven)
        np.testing.assert_array_equal(sess.run([v, w]), [seven, seven])
        np.testing.assert_array_equal(sess.run(new_w), seven)
        sess.run(v.assign([1, 1]))
        group = dtf.broadcast_variables([v], root_rank=0)
        assert isinstance(group, tf.Operation)
        sess.run(group)
        np.testing.assert_array_equal(sess.run(v), seven)
    assert dtf.broadcast_variables([tf.Variable(1.0)], root_rank=0) is None  # eagerly: done, nothing to run


def test_graphs_can_broadcast_before_init(monkeypatch: pytest.MonkeyPatch) -> None:
    # Horovod builds graph ops before hvd.init(); the world is only needed when they run.
    monkeypatch.setattr(ddl, "size", lambda: pytest.fail("the world was asked for while building a graph"))
    with tf.Graph().as_default():
        assert isinstance(dtf.broadcast_global_variables(0), tf.Operation)
        tf.compat.v1.Variable(1.0)
        assert isinstance(dtf.broadcast_global_variables(0), tf.Operation)


def test_local_sources_are_kept_and_split_out() -> None:
    shared, local = tf.Variable([1.0, 2.0]), tf.Variable(tf.ones((4, 2)))
    with tf.GradientTape(persistent=True) as plain:
        loss = tf.reduce_sum(shared * 3.0) + tf.reduce_sum(tf.gather(local, [1, 3]))
    tape = dtf.DistributedGradientTape(plain)
    tape.register_local_source(local)
    local_pairs, shared_pairs = tape.get_local_and_global_gradients(loss, [shared, local])
    assert [v is local for v, _ in local_pairs] == [True] and [v is shared for v, _ in shared_pairs] == [True]
    assert isinstance(local_pairs[0][1], tf.IndexedSlices)  # scaled by 1/size as IndexedSlices, not densified
    np.testing.assert_array_equal(shared_pairs[0][1], [3.0, 3.0])


def test_keras_compute_gradients_then_apply_reduces_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    reduce = dk.DistributedOptimizer._reduce

    def counting(self, grads, tvs):  # type: ignore[no-untyped-def]
        calls.append(len(grads))
        return reduce(self, grads, tvs)

    monkeypatch.setattr(dk.DistributedOptimizer, "_reduce", counting)
    x = tf.Variable([2.0, 3.0])
    opt = dk.DistributedOptimizer(keras.optimizers.SGD(0.5))
    pairs = opt.compute_gradients(lambda: tf.reduce_sum(x * x), [x])
    opt.apply_gradients(pairs)
    assert calls == [1] and x.numpy().tolist() == [0.0, 0.0]
    opt.apply([tf.ones(2)], [x])  # gradients from anywhere else are reduced
    assert calls == [1, 1] and x.numpy().tolist() == [-0.5, -0.5]

    @tf.function
    def step() -> None:
        opt.apply_gradients(opt._compute_gradients(lambda: tf.reduce_sum(x), [x]))

    step()
    assert calls == [1, 1, 1] and x.numpy().tolist() == [-1.0, -1.0]


def test_keras_compute_gradients_accumulates_and_forgets_an_inf_step() -> None:
    # backward_passes_per_step=2: passes 1 and 2 make one update; an inf gradient in the first
    # cycle must not leak into the second (the sums are zeroed, not decremented).
    x = tf.Variable(0.0)
    step = tf.Variable(0)
    opt = dk.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)

    def loss() -> tf.Tensor:
        step.assign_add(1)
        return tf.cond(step > 1, lambda: x * 1.0, lambda: x * float("inf"))

    returned = []
    for _ in range(4):
        pairs = opt.compute_gradients(loss, [x])
        returned.append(float(pairs[0][0]))
        opt.apply_gradients(pairs)
    assert returned[:2] == [float("inf"), float("inf")] and returned[2:] == [1.0, 2.0]
    assert int(opt.iterations) == 2
