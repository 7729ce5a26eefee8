"""Tier 1: what Horovod's TF tests expect of ddl.tensorflow: Session graphs, error classes, Compression."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

import ddl  # noqa: E402
import ddl.tensorflow as dtf  # noqa: E402
from ddl.tensorflow.bridge import graph_name  # noqa: E402
from ddl.tensorflow.errors import CollectiveArgumentError, CollectiveMismatchError, as_tf_errors  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def world() -> None:
    ddl.init()


def _collective_ops(graph: tf.Graph) -> list[tf.Operation]:
    return [op for op in graph.get_operations() if op.name.startswith("ddl_")]


def test_session_graph_runs_collectives_in_trace_order() -> None:
    # A Session may start ready ops in any order; ranks must not pick different ones first.
    with tf.Graph().as_default() as graph:
        xs = [tf.ones([3]) * i for i in range(4)]
        outs = [dtf.allreduce(x, op=ddl.Sum) for x in xs] + [dtf.allgather(xs[0])]
        ops = _collective_ops(graph)
        assert len(ops) == 5
        for before, after in zip(ops, ops[1:], strict=False):
            assert before in after.control_inputs
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
