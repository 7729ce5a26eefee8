"""The no-ssh node protocol: its messages, the master's roster, hydra's manual-launcher lines."""

from __future__ import annotations

import pytest

from ddl.launcher.node_launch import manual_argv, refuse_open_mpi
from ddl.launcher.node_protocol import (
    Assign,
    Done,
    Hello,
    NodeProtocolError,
    Refuse,
    Roster,
    admit,
    decode,
    encode,
    hosts_argument,
    parse_launch_lines,
    reachable_proxy,
    waiting_line,
)

# What MPICH 5.0.2's `mpiexec -launcher manual -hosts tj-node-0-0:1,tj-node-0-1:1 -n 2 ...` printed here.
HYDRA_LINES = [
    "HYDRA_LAUNCH: /v/bin/hydra_pmi_proxy --control-port tj-node-0-0:44431 --rmk user --launcher manual --demux "
    "poll --pgid 0 --retries 10 --usize -1 --pmi-port 0 --gpus-per-proc -2 --gpu-subdevs-per-proc -2 --proxy-id 0 ",
    "HYDRA_LAUNCH: /v/bin/hydra_pmi_proxy --control-port tj-node-0-0:44431 --rmk user --launcher manual --demux "
    "poll --pgid 0 --retries 10 --usize -1 --pmi-port 0 --gpus-per-proc -2 --gpu-subdevs-per-proc -2 --proxy-id 1 ",
]


@pytest.mark.parametrize("message", [Hello(1, 2, 4, "tj-node-0-1"), Assign(("p", "--proxy-id", "1")),
                                     Refuse("why"), Done(0), Done(137)])
def test_messages_survive_a_line(message: object) -> None:
    line = encode(message)  # type: ignore[arg-type]
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line) == message


@pytest.mark.parametrize(("line", "words"), [
    (b"GET / HTTP/1.1\r\n", "not a ddlrun node message"),
    (b'{"v": 2, "kind": "done", "status": 0}', "protocol version 2, not 1"),
    (b'{"v": 1, "kind": "shout"}', "unknown ddlrun node message kind 'shout'"),
    (b'{"v": 1, "kind": "done"}', "a 'done' message with wrong fields"),
    (b"", "not a ddlrun node message"),
])
def test_what_is_not_a_message_is_named(line: bytes, words: str) -> None:
    with pytest.raises(NodeProtocolError, match=words):
        decode(line)


def roster(nnodes: int = 3) -> Roster:
    return Roster(nnodes, 2, {0: Hello(0, nnodes, 2, "n0")})


def test_nodes_join_until_the_roster_is_complete() -> None:
    r = roster()
    assert r.missing == [1, 2] and not r.complete
    r, refused = admit(r, Hello(2, 3, 2, "n2"), connected=[])
    assert refused is None and r.missing == [1]
    r, refused = admit(r, Hello(1, 3, 2, "n1"), connected=[2])
    assert refused is None and r.complete
    assert hosts_argument(r) == [("n0", 2), ("n1", 2), ("n2", 2)]


@pytest.mark.parametrize(("hello", "connected", "words"), [
    (Hello(1, 4, 2, "n1"), [], "was told 4 nodes but the master (n0) was told 3"),
    (Hello(1, 3, 1, "n1"), [], "runs 1 ranks per node but the master (n0) runs 2"),
    (Hello(0, 3, 2, "x"), [], "node rank 0 is not one of 1..2 (0 is the master's)"),
    (Hello(3, 3, 2, "x"), [], "node rank 3 is not one of 1..2"),
    (Hello(1, 3, 2, "other"), [1], "node rank 1 has already joined from n1"),
])
def test_a_node_that_does_not_fit_is_refused_with_the_reason(hello: Hello, connected: list[int], words: str) -> None:
    start, _ = admit(roster(), Hello(1, 3, 2, "n1"), connected=[])
    after, refused = admit(start, hello, connected=connected)
    assert refused is not None and words in refused.reason, refused
    assert after == start


def test_a_node_whose_connection_is_gone_may_join_again() -> None:
    start, _ = admit(roster(), Hello(1, 3, 2, "old"), connected=[])
    after, refused = admit(start, Hello(1, 3, 2, "new"), connected=[])
    assert refused is None and after.joined[1].hostname == "new"


def test_the_waiting_line_names_the_missing_nodes() -> None:
    assert waiting_line(roster(), elapsed=12.4, timeout=300) == "waiting for node(s) 1, 2 of 3 to join (12 s of 300 s)"


def test_nodes_on_one_machine_keep_a_proxy_each() -> None:
    r = Roster(3, 1, {0: Hello(0, 3, 1, "vm"), 1: Hello(1, 3, 1, "vm"), 2: Hello(2, 3, 1, "other")})
    assert hosts_argument(r) == [("vm-0", 1), ("vm-1", 1), ("other", 1)]


def test_hydras_launch_lines_give_each_proxy_its_command() -> None:
    proxies = parse_launch_lines(["something else", *HYDRA_LINES])
    assert sorted(proxies) == [0, 1]
    assert proxies[1][0] == "/v/bin/hydra_pmi_proxy" and proxies[1][-2:] == ["--proxy-id", "1"]
    reached = reachable_proxy(proxies[1], "tj-node-0-0.tj")
    assert reached[reached.index("--control-port") + 1] == "tj-node-0-0.tj:44431"
    assert proxies[1][proxies[1].index("--control-port") + 1] == "tj-node-0-0:44431"  # not modified in place


@pytest.mark.parametrize(("lines", "words"), [
    (["HYDRA_LAUNCH: /v/bin/hydra_pmi_proxy --control-port a:1"], "names no --proxy-id"),
    ([HYDRA_LINES[0], HYDRA_LINES[0]], "printed proxy 0 twice"),
])
def test_unexpected_launch_lines_are_errors(lines: list[str], words: str) -> None:
    with pytest.raises(NodeProtocolError, match=words):
        parse_launch_lines(lines)


def test_the_master_runs_hydra_with_the_manual_launcher_and_each_nodes_own_environment() -> None:
    argv = manual_argv(["/v/bin/mpiexec", "-n", "4", "-hosts", "a:2,b:2", "-genv", "DDL_VERBOSE", "1", "x"])
    assert argv[:4] == ["/v/bin/mpiexec", "-launcher", "manual", "-genvnone"]
    assert argv[4:] == ["-n", "4", "-hosts", "a:2,b:2", "-genv", "DDL_VERBOSE", "1", "x"]


def test_open_mpi_is_refused_for_nodes_without_ssh() -> None:
    refuse_open_mpi("mpich")
    with pytest.raises(ValueError, match="need MPICH's hydra"):
        refuse_open_mpi("openmpi")
