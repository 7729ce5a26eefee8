"""The negotiation as pure functions of (local batch, gathered words), up to 1024 ranks."""

from __future__ import annotations

import numpy as np
import pytest

from ddl.base.config import Config, settings_differences
from ddl.engine import codec
from ddl.engine import negotiation as neg


def words_for(headers: list[tuple[int, int, int, int, int]], record: int = codec.RECORD_BYTES) -> memoryview:
    """The gathered records of ``headers`` (digest, length, stop, inline, due), one per rank,
    each of ``record`` bytes."""
    buf = np.zeros(len(headers) * record, np.uint8)
    words = memoryview(buf.data).cast("q")
    for q, head in enumerate(headers):
        for i, v in enumerate(head):
            words[q * record // 8 + i] = v
    return words


def test_records_shrink_as_the_world_grows_then_the_exchange_turns_compact() -> None:
    """4 KiB of payload a rank below 17 ranks; a 128-byte record up to 64 (its gather
    costs what the compact allreduce does, so a small call stays one collective); from 65
    the compact exchange, with no payload."""
    assert [codec.inline_capacity(p) for p in (2, 16, 17, 64, 65, 1024)] == [4096, 4096, 88, 88, 0, 0]
    assert [codec.record_bytes(p) for p in (2, 16, 17, 64)] == [4136, 4136, 128, 128]
    assert not codec.compact(codec.COMPACT_FROM - 1) and codec.compact(codec.COMPACT_FROM)
    # The gather waits in MPI's own wait only from 17 ranks on hosts with more ranks than
    # cores, outside elastic worlds (a lost peer must not hold a rank in it).
    cases = ((16, False, False), (17, False, False), (32, True, False), (64, False, False), (32, False, True))
    assert [codec.gather_blocks(*case) for case in cases] == [False, True, False, True, False]


def test_records_through_shared_memory_keep_4_kib_up_to_the_compact_exchange() -> None:
    """On one memory node every rank reads the others' records where they lie, so they keep
    their 4 KiB payload up to 64 ranks; elastic worlds, several nodes and 2 ranks (whose
    prepared gather is cheaper) gather over MPI."""
    assert [codec.inline_capacity(p, shared=True) for p in (2, 17, 64, 65)] == [4096, 4096, 4096, 0]
    assert [codec.record_bytes(p, shared=True) for p in (2, 17, 64)] == [4136] * 3
    cases = ((3, True, False), (64, True, False), (65, True, False), (32, False, False), (32, True, True), (2, True, False))
    assert [codec.shared_records(*case) for case in cases] == [True, True, False, False, False, False]


@pytest.mark.parametrize("p", [17, 64])
def test_small_records_decide_as_the_large_ones(p: int) -> None:
    rec = codec.record_bytes(p)
    heads = [(5, 2, 0, 0, 0)] * p
    assert codec.decide(words_for(heads, rec), p, 5, 2, rec // 8) == codec.Verdict("run", all_stop=False)
    assert codec.all_hold(words_for(heads, rec), p, 5, 2, rec // 8)
    heads[p - 1] = (9, 4, 0, 0, 0)
    words = words_for(heads, rec)
    assert not codec.all_hold(words, p, 5, 2, rec // 8)
    assert codec.decide(words, p, 5, 2, rec // 8) == codec.Verdict("prefix", all_stop=False, prefix=2)


@pytest.mark.parametrize("p", [2, 3, 256, 1024])
def test_equal_lists_run_and_every_rank_decides_alike(p: int) -> None:
    words = words_for([(77, 3, 0, 0, 0)] * p)
    verdicts = {codec.decide(words, p, 77, 3) for _ in range(p)}
    assert verdicts == {codec.Verdict("run", all_stop=False, inline=False)}
    inline = words_for([(77, 3, 0, 96, 0)] * p)
    assert codec.decide(inline, p, 77, 3).inline


@pytest.mark.parametrize("p", [3, 300])
def test_one_rank_ahead_gets_a_prefix_round_and_an_empty_rank_idles(p: int) -> None:
    heads = [(5, 2, 0, 0, 0)] * p
    heads[p - 1] = (9, 4, 0, 0, 0)  # the last rank has submitted two more
    words = words_for(heads)
    for mine in ((5, 2), (9, 4)):
        assert codec.decide(words, p, *mine) == codec.Verdict("prefix", all_stop=False, prefix=2)
    heads[0] = (0, 0, 0, 0, 0)  # a rank with nothing pending: nothing is ready anywhere
    assert codec.decide(words_for(heads), p, 5, 2).action == "idle"
    heads[1] = (5, 2, 0, 0, 1)  # ...unless some rank's stall check is due
    assert codec.decide(words_for(heads), p, 5, 2).action == "match"


def test_stop_needs_every_rank_and_names_the_ones_still_running() -> None:
    p = 260
    heads = [(0, 0, 1, 0, 0)] * p
    assert codec.decide(words_for(heads), p, 0, 0).all_stop
    heads[7] = heads[200] = (0, 0, 0, 0, 0)
    verdict = codec.decide(words_for(heads), p, 0, 0)
    assert not verdict.all_stop and verdict.waiting_to_stop == "rank(s) [7, 200]"


def test_prefix_agreement_is_all_or_nothing() -> None:
    p = 512
    words = words_for([(11, 2, 0, 0, 0)] * p)
    assert codec.all_hold(words, p, 11, 2)
    heads = [(11, 2, 0, 0, 0)] * p
    heads[300] = (12, 2, 0, 0, 0)
    assert not codec.all_hold(words_for(heads), p, 11, 2)


def compact_exchange(vectors: list[list[int]]) -> list[int]:
    """What the MIN-Allreduce of every rank's compact vector gives."""
    return np.min(np.array(vectors, dtype=np.int64), axis=0).tolist()


@pytest.mark.parametrize("p", [65, 256, 1024])
def test_compact_exchange_decides_like_the_gathered_one(p: int) -> None:
    assert codec.compact(p) and not codec.compact(codec.COMPACT_FROM - 1)
    same = compact_exchange([codec.compact_vector(77, 3, False, False)] * p)
    assert codec.decide_compact(same, 77, 3) == codec.Verdict("run", all_stop=False)
    vectors = [codec.compact_vector(5, 2, False, False)] * p
    vectors[p - 1] = codec.compact_vector(9, 4, False, False)
    v = compact_exchange(vectors)
    assert codec.decide_compact(v, 5, 2) == codec.decide_compact(v, 9, 4) == codec.Verdict("prefix", False, prefix=2)
    vectors[0] = codec.compact_vector(0, 0, False, False)
    assert codec.decide_compact(compact_exchange(vectors), 5, 2).action == "idle"
    vectors[1] = codec.compact_vector(5, 2, False, True)
    assert codec.decide_compact(compact_exchange(vectors), 5, 2).action == "match"
    stops = [codec.compact_vector(0, 0, True, False)] * p
    assert codec.decide_compact(compact_exchange(stops), 0, 0).all_stop
    stops[3] = codec.compact_vector(0, 0, False, False)
    verdict = codec.decide_compact(compact_exchange(stops), 0, 0)
    assert not verdict.all_stop and verdict.waiting_to_stop == "some ranks"
    # The prefix round: all-or-nothing, as with gathered records.
    assert codec.compact_all_hold(compact_exchange([codec.compact_vector(11, 2, False, False)] * p), 11, 2)
    mixed = [codec.compact_vector(11, 2, False, False)] * p
    mixed[p // 2] = codec.compact_vector(12, 2, False, False)
    assert not codec.compact_all_hold(compact_exchange(mixed), 11, 2)


def desc(name: str, shape: tuple[int, ...] = (3,), kind: str = "allreduce") -> neg.Descriptor:
    return neg.Descriptor(kind, name, (shape, "float32", "SUM"), "auto", "none")


def test_match_pairs_by_name_in_one_order_at_300_ranks() -> None:
    p = 300
    everyone = [[desc("b"), desc("a")] if q % 2 else [desc("a"), desc("b")] for q in range(p)]
    everyone[17].append(desc("late"))
    everyone[250][0] = desc("a", (4,)) if everyone[250][0].name == "a" else everyone[250][0]
    everyone[123] = [d if d.name != "b" else neg.error_descriptor("b", "allreduce", TypeError("complex64"))
                     for d in everyone[123]]
    result = neg.match(everyone)
    assert result.ready == []
    assert set(result.failed) == {"a", "b"}
    failing_b, message_b = result.failed["b"]
    assert failing_b == (123,) and "rank 123 could not start allreduce 'b'" in message_b and "complex64" in message_b
    failing_a, message_a = result.failed["a"]
    assert failing_a == () and "rank 250: allreduce(a, (4,)" in message_a and "(3,)" in message_a
    assert result.missing == {"late": [17]}


def test_match_orders_ready_names_identically_for_every_rank() -> None:
    p = 257
    rng = np.random.default_rng(0)
    names = [f"t{i}" for i in range(20)]
    everyone = [[desc(n) for n in rng.permutation(names)] for _ in range(p)]
    result = neg.match(everyone)
    assert sorted(result.ready) == sorted(names) and not result.failed and not result.missing
    assert result.ready == [d.name for d in everyone[0]]  # first rank's order, seen alike by all


def test_settings_that_change_the_call_sequence_are_compared() -> None:
    base = Config().sequence_settings(topology=None, version="1")
    other = Config(fusion_threshold=0, segment_bytes=4096).sequence_settings(topology=None, version="1")
    assert settings_differences([base, base, base]) == []
    diff = settings_differences([base, other, base])
    assert "DDL_FUSION_THRESHOLD: ranks 0,2: 67108864; rank 1: 0" in diff
    assert "DDL_SEGMENT_BYTES: ranks 0,2: 1048576; rank 1: 4096" in diff
    calib = Config(calibration="off").sequence_settings(topology=None, version="1")
    assert settings_differences([base, calib]) == ["DDL_CALIBRATION: rank 0: on; rank 1: off"]
    # A calibration file is one rank's business (rank 0 reads it): no difference.
    path = Config(calibration="/tmp/c.json").sequence_settings(topology=None, version="1")
    assert settings_differences([base, path]) == []
    # Settings that do not change the call sequence may differ.
    assert settings_differences([base, Config(stall_timeout=5, verbose=True).sequence_settings(
        topology=None, version="1")]) == []
    assert settings_differences([base, Config().sequence_settings(topology=None, version="2")])


def test_a_counted_name_hashes_alike_from_its_parts_and_from_its_text() -> None:
    """The lean path hashes an unnamed call from (stem, count) without formatting its name:
    it must get the digest every other path computes from the descriptor."""
    for stem, count in (("#", 1), ("#", 123456789), ("#loader.", 7), ("grad.layer", 12)):
        assert neg.name_digest(f"{stem}{count}") == neg.counted_digest(stem, count)
    d = neg.Descriptor("allreduce", "#42", ((3,), "float32", "SUM"), "auto", "none")
    body = neg.body_digest(d.kind, d.fields, d.algorithm, d.compression)
    assert neg.digest(d) == (body ^ neg.counted_digest("#", 42)) & neg.MASK
    # Distinct names, distinct digests; a count written with a leading zero is another name.
    names = [f"#{n}" for n in range(2000)] + ["#07", "w", "w0", "w00"]
    assert len({neg.name_digest(n) for n in names}) == len(names)
    assert neg.name_digest("#07") != neg.name_digest("#7")
