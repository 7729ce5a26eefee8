"""Elastic state objects in a world of one: commit, restore, the store, sync from the newest commit,
the samplers' resharding, the Keras callbacks and ddl-caffe's readers; and the host agent, forking
a rank for a stub and reporting how it ended."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import torch

import ddl
import ddl.torch.elastic as torch_elastic
from ddl.base.errors import HostsUpdatedInterrupt
from ddl.runtime import elastic
from ddl.runtime.elastic import link
from ddl.runtime.elastic import state as state_module
from ddl.runtime.elastic.protocol import (
    AgentWarm,
    Quit,
    RankEnded,
    RankStarted,
    Route,
    StopWhy,
    StopWorld,
    encode,
)
from ddl.runtime.elastic.store import CommitStore
from ddl.runtime.elastic.wire import LineReader

ROOT = Path(__file__).resolve().parents[2]
M = TypeVar("M")


@pytest.fixture(scope="module", autouse=True)
def world() -> None:
    ddl.init()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This rank keeps a host store in ``tmp_path`` (as under ddlrun --elastic, without an agent)."""
    real = state_module.context()
    fake = types.SimpleNamespace(config=types.SimpleNamespace(elastic_store=str(tmp_path), elastic_world=0),
                                 topology=real.topology)
    monkeypatch.setattr(state_module, "context", lambda: fake)
    monkeypatch.setattr(link, "context", lambda: fake)
    yield tmp_path


def test_object_state_commits_restores_and_keeps_only_its_values() -> None:
    state = elastic.ObjectState(epoch=0, history=[1])
    state.epoch, state.history = 3, [1, 2]
    state.commit()
    state.epoch = 9
    state.history.append(3)  # changed in place: restore still undoes it
    state.restore()
    assert (state.epoch, state.history, state.commits) == (3, [1, 2], 1)
    calls: list[int] = []
    state.register_reset_callbacks([lambda: calls.append(ddl.size())])
    state.on_reset()
    assert calls == [1]


def test_a_commit_lands_in_the_store_and_a_new_process_syncs_from_it(store: Path) -> None:
    state = elastic.ObjectState(step=0, weights=np.zeros(3))
    for _ in range(3):
        state.step += 1
        state.weights = state.weights + 1
        state.commit()
    assert CommitStore(store).serial() == 3
    fresh = elastic.ObjectState(step=0, weights=np.zeros(3))  # the next world's process
    fresh.sync()
    assert fresh.step == 3 and fresh.commits == 3 and fresh.weights.tolist() == [3, 3, 3]


def test_without_a_commit_sync_keeps_the_state_as_it_is(store: Path) -> None:
    state = elastic.ObjectState(step=5)
    state.step = 6
    state.sync()
    assert state.step == 6 and CommitStore(store).serial() == 0


def test_commit_raises_hosts_updated_when_ddlrun_announced_them(monkeypatch: pytest.MonkeyPatch) -> None:
    state = elastic.ObjectState(step=1)
    monkeypatch.setattr(state_module, "updates_pending", lambda: True)
    with pytest.raises(HostsUpdatedInterrupt):
        state.commit()
    assert state.commits == 1  # saved before the interrupt: nothing is lost


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def test_torch_state_carries_model_optimizer_sampler_and_values(store: Path) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = list(range(50))
    sampler = torch_elastic.ElasticSampler(data, seed=3, batch_size=5)
    state = torch_elastic.TorchState(model=model, optimizer=opt, sampler=sampler, step=0)
    for batch in range(2):
        opt.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        sampler.record_batch(batch, 5)
        state.step += 1
    state.commit()
    saved = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1)
    state.restore()
    assert all(torch.equal(a, b) for a, b in zip(saved, model.parameters(), strict=True))

    model2 = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.5, momentum=0.9)
    sampler2 = torch_elastic.ElasticSampler(data, seed=3, batch_size=5)
    fresh = torch_elastic.TorchState(model=model2, optimizer=opt2, sampler=sampler2, step=0)
    fresh.sync()  # from the store, as the next world does
    assert fresh.step == 2 and fresh.model is model2
    assert all(torch.equal(a, b) for a, b in zip(saved, model2.parameters(), strict=True))
    assert opt2.param_groups[0]["lr"] == 0.1 and len(opt2.state) == len(opt.state) == 4
    assert sampler2.processed_num == 10 and list(sampler2) == list(sampler) and len(sampler2) == 40


def test_the_sampler_deals_the_rest_of_the_epoch_over_a_new_world(monkeypatch: pytest.MonkeyPatch) -> None:
    data = list(range(103))

    def sampler_at(rank: int, size: int, state: dict[str, int] | None = None) -> torch_elastic.ElasticSampler:
        monkeypatch.setattr(torch_elastic, "rank", lambda: rank)
        monkeypatch.setattr(torch_elastic, "size", lambda: size)
        s = torch_elastic.ElasticSampler(data, seed=1, batch_size=4)
        if state:
            s.load_state_dict(state)
        return s

    first = [sampler_at(r, 3) for r in range(3)]
    seen = [i for s in first for i in list(s)[:8]]  # two batches of 4 on each of 3 ranks
    for s in first:
        s.record_batch(0, 4)
        s.record_batch(1, 4)
    after = [sampler_at(r, 2, first[0].state_dict()) for r in range(2)]
    rest = [i for s in after for i in s]
    assert len({len(s) // 4 + (len(s) % 4 > 0) for s in after}) == 1  # same number of batches
    assert sorted(seen + rest) == data  # every sample once, across the resize
    first[0].set_epoch(1)
    assert first[0].processed_num == 0 and list(first[0]) != list(sampler_at(0, 3))


def test_caffe_readers_continue_the_record_stream_over_a_new_world() -> None:
    pytest.importorskip("lmdb")
    from ddl.caffe.data.database import DatumReader
    from ddl.caffe.solver.elastic import reshard
    from ddl.runtime.elastic.position import DataPosition

    source = ROOT / "examples" / "caffe" / "data" / "digits_train_lmdb"
    every = DatumReader(source)
    stream = [every.next_raw()[0] for _ in range(60)]  # the records in the order one rank reads them

    layers = [types.SimpleNamespace(name="d", reader=DatumReader(source, rank=r, size=3)) for r in range(3)]
    for layer in layers:
        for _ in range(5):
            layer.reader.next_raw()
    after = [types.SimpleNamespace(name="d", reader=DatumReader(source, rank=r, size=2)) for r in range(2)]
    for r, layer in enumerate(after):
        reshard([layer], {"d": DataPosition(processed=15)}, rank=r, size=2)
    got = [[layer.reader.next_raw()[0] for _ in range(4)] for layer in after]
    assert got[0] == stream[15:23:2] and got[1] == stream[16:24:2]


def test_keras_state_and_callbacks_keep_the_data_position(store: Path) -> None:
    pytest.importorskip("tensorflow")
    import keras

    import ddl.tensorflow.keras as dk
    from ddl.tensorflow.keras import elastic as keras_elastic

    x, y = np.random.default_rng(0).standard_normal((40, 3)).astype(np.float32), np.arange(40) % 2
    data = keras_elastic.ElasticDataset(x, y, batch_size=4, seed=2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=dk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    state = keras_elastic.KerasState(model, data=data, epoch=0, batch=0)
    callbacks = [keras_elastic.CommitStateCallback(state, batches_per_commit=3),  # first: it must not matter
                 keras_elastic.UpdateBatchStateCallback(state), keras_elastic.UpdateEpochStateCallback(state)]

    class StopAfter(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 6:
                self.model.stop_training = True

    model.fit(data, epochs=1, verbose=0, callbacks=[StopAfter(), *callbacks])
    # 7 batches; commits after 3 and 6, and at the (early) end of the epoch, which is not over
    assert (state.epoch, state.batch, data.processed_num, state.commits) == (0, 7, 28, 3)
    weights = [w.copy() for w in model.get_weights()]
    model.fit(data, epochs=1, verbose=0, callbacks=callbacks)  # the rest of the epoch: 3 batches
    assert (state.epoch, state.batch, data.epoch, data.processed_num) == (1, 0, 1, 0)
    fresh_data = keras_elastic.ElasticDataset(x, y, batch_size=4, seed=2)
    fresh = keras_elastic.KerasState(model, data=fresh_data, epoch=0, batch=0)
    assert CommitStore(store).serial() == state.commits
    fresh.sync()
    assert (fresh.epoch, fresh_data.epoch) == (1, 1)
    assert not all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights(), strict=True))


# -- the host agent, without MPI --------------------------------------------------------------


def _agent_and_supervisor(tmp_path: Path, command: list[str], *, host: str = "h1",
                          ) -> tuple[subprocess.Popen[bytes], socket.socket, socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    agent = subprocess.Popen([sys.executable, "-m", "ddl.launcher.elastic.agent", "--connect",
                              f"127.0.0.1:{server.getsockname()[1]}", "--job", "t", "--root", str(tmp_path),
                              "--host", host, "--timeout", "20", "--", *command])
    server.settimeout(30)
    conn, _ = server.accept()
    conn.settimeout(30)
    return agent, server, conn


class Messages:
    """What the agent sends ddlrun, read one message at a time."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.reader = conn, LineReader(Route.AGENT_TO_SUPERVISOR)
        self.queue: list[Any] = []
        self.seen: list[Any] = []

    def until(self, kind: type[M]) -> M:
        while True:
            while not self.queue:
                messages = self.reader.receive(self.conn)
                assert messages is not None, f"the agent closed the connection before {kind.__name__}; saw {self.seen}"
                self.queue += messages
            message = self.queue.pop(0)
            self.seen.append(message)
            if isinstance(message, kind):
                return message


def test_the_agent_forks_a_warm_rank_for_a_stub_and_reports_its_end(tmp_path: Path) -> None:
    code = "import json, os, sys; print('rank', os.environ['PMI_RANK'], json.__name__, flush=True); sys.exit(7)"
    agent, server, conn = _agent_and_supervisor(tmp_path, [sys.executable, "-c", code])
    messages = Messages(conn)
    try:
        assert "json" in messages.until(AgentWarm).imported
        env = {**os.environ, "PMI_RANK": "0", "PMI_SIZE": "2", "DDL_ELASTIC_WORLD": "1"}
        stub = subprocess.run([sys.executable, "-m", "ddl.launcher.elastic.stub", "--root", str(tmp_path), "--job", "t",
                               "--hosts", "h1,h1",
                               "--", sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert (stub.returncode, stub.stdout) == (7, "rank 0 json\n"), stub.stderr
        ended = messages.until(RankEnded)
        assert (ended.world, ended.rank, ended.code, ended.cause.value) == (1, 0, 7, "exit")

        # ddlrun says stop: the rank is killed, and the stub ends as it did.
        sleeper = "import time; time.sleep(60)"
        env["PMI_RANK"] = "1"
        stub2 = subprocess.Popen([sys.executable, "-m", "ddl.launcher.elastic.stub", "--root", str(tmp_path), "--job", "t",
                                  "--hosts", "h1,h1",
                                  "--", sys.executable, "-c", sleeper], env=env)
        messages.until(RankStarted)
        conn.sendall(encode(StopWorld(world=1, why=StopWhy.DONE, lost=[])))
        assert stub2.wait(timeout=30) == -9
        assert messages.until(RankEnded).cause.value == "stop"
        conn.sendall(encode(Quit()))
        assert agent.wait(timeout=30) == 0
        assert not (tmp_path / "ddl-elastic-t").exists()  # the agent removed its folder
    finally:
        if agent.poll() is None:
            agent.kill()
        conn.close()
        server.close()


def test_an_agent_that_hears_nothing_from_ddlrun_ends_itself(tmp_path: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    agent = subprocess.Popen([sys.executable, "-m", "ddl.launcher.elastic.agent", "--connect",
                              f"127.0.0.1:{server.getsockname()[1]}", "--job", "t", "--root", str(tmp_path),
                              "--host", "h1", "--timeout", "1", "--", sys.executable, "-c", "pass"],
                             stderr=subprocess.PIPE, text=True)
    conn, _ = server.accept()
    start = time.monotonic()
    try:
        _, err = agent.communicate(timeout=30)
    finally:
        conn.close()
        server.close()
    assert agent.returncode == 0 and "nothing from ddlrun for 1 s" in err
    assert time.monotonic() - start < 15


def test_two_list_entries_on_one_machine_get_an_agent_each(tmp_path: Path) -> None:
    """Agents are addressed by their name in ddlrun's host list, not the machine's host name:
    two entries naming this machine get two folders and two sockets, and each stub finds the
    agent of its rank's entry (the old agents shared one socket, and the second unlinked the first's)."""
    code = "import os, sys; print(os.environ['DDL_ELASTIC_STORE'].rsplit('/', 1)[1], flush=True)"
    agents = [_agent_and_supervisor(tmp_path, [sys.executable, "-c", code], host=h) for h in ("here", "also-here")]
    try:
        for _, _, conn in agents:
            Messages(conn).until(AgentWarm)
        assert sorted(p.name for p in (tmp_path / "ddl-elastic-t").iterdir()) == ["also-here", "here"]
        for rank, expected in ((0, "here"), (1, "also-here")):
            env = {**os.environ, "PMI_RANK": str(rank), "PMI_SIZE": "2", "DDL_ELASTIC_WORLD": "1"}
            stub = subprocess.run([sys.executable, "-m", "ddl.launcher.elastic.stub", "--root", str(tmp_path),
                                   "--job", "t", "--hosts", "here,also-here", "--", sys.executable, "-c", code],
                                  env=env, capture_output=True, text=True, timeout=60)
            assert (stub.returncode, stub.stdout.strip()) == (0, expected), stub.stderr
    finally:
        for agent, server, conn in agents:
            with contextlib.suppress(OSError):
                conn.sendall(encode(Quit()))
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.wait(timeout=30)
            if agent.poll() is None:
                agent.kill()
            conn.close()
            server.close()


def test_the_agent_reaps_only_its_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module the agent preloaded may start children of its own; the agent waits for its ranks'
    pids only (never ``waitpid(-1)``), so those children's statuses stay theirs to collect."""
    from ddl.launcher.elastic import agent as agent_module
    from ddl.launcher.elastic.agent_machine import AgentState, RankEntry
    from ddl.launcher.elastic.timing import Timing

    server = socket.create_server(("127.0.0.1", 0))
    try:
        agent = agent_module.Agent(address=("127.0.0.1", server.getsockname()[1]), job="t", root=str(tmp_path),
                                   host="h1", timing=Timing(), command=[sys.executable, "-c", "pass"])
        rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        theirs = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"])  # a preloaded module's child
        deadline = time.monotonic() + 30
        while Path(f"/proc/{theirs.pid}/stat").read_text().split()[2] != "Z":  # exited, not yet waited for
            assert time.monotonic() < deadline
            time.sleep(0.05)
        agent.state = AgentState(host="h1", last_heard=time.monotonic(),
                                 ranks={rank.pid: RankEntry(pid=rank.pid, world=1, rank=0)})
        assert agent._reaped() == []  # its rank runs; the other child is not its to reap
        assert theirs.wait(timeout=5) == 5  # still there for its owner
        rank.kill()
        rank.wait()
        agent.supervisor.close()
    finally:
        server.close()
