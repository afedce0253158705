"""Gang placement over the free-capacity index (warden.engine.placement).

Unit tests pin the best-fit choices and tie-breaks; a stateful hypothesis test drives random
take/give/place/mark/rollback/find sequences against a brute-force model that enumerates every
multiset of nodes, and against a literal one-replica-at-a-time greedy written from the spec.
"""

from __future__ import annotations

from collections import Counter
from itertools import combinations_with_replacement

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from warden.engine.model import Node
from warden.engine.placement import CapacityIndex, assign_gpu_indices, gpu_mask

CONSTRAINTS = ("pack", "block", "any")


def _idx(*nodes: Node) -> CapacityIndex:
    return CapacityIndex(nodes)


def _snapshot(idx: CapacityIndex, nodes: list[Node]) -> dict[str, tuple[int, int, int]]:
    return {n.name: idx.free(n.name) for n in nodes}


# --------------------------------------------------------------------------- pack


def test_pack_picks_fewest_free_gpus_that_fit() -> None:
    idx = _idx(Node("a", 8), Node("b", 8), Node("c", 8))
    idx.take("a", 6)  # 2 free: too small for 2x2
    idx.take("b", 3)  # 5 free: best fit
    assert idx.find("default", 2, 2, constraint="pack") == ("b", "b")
    assert idx.find("default", 1, 2, constraint="pack") == ("a",)
    assert idx.find("default", 1, 6, constraint="pack") == ("c",)
    assert idx.find("default", 2, 3, constraint="pack") == ("c", "c")
    assert idx.find("default", 3, 3, constraint="pack") is None
    assert idx.find("default", 1, 9, constraint="pack") is None


def test_pack_ties_go_to_constructor_order_not_name_or_history() -> None:
    nodes = [Node("z", 8), Node("m", 8), Node("a", 8)]
    idx = CapacityIndex(nodes)
    assert idx.find("default", 1, 8, constraint="pack") == ("z",)
    # Move "z" out of the 8-bucket and back: it must still win the tie (order is by position,
    # not by when a node re-entered its bucket).
    idx.take("z", 1)
    assert idx.find("default", 1, 8, constraint="pack") == ("m",)
    idx.give("z", 1)
    assert idx.find("default", 1, 8, constraint="pack") == ("z",)


def test_pack_none_when_total_is_enough_but_no_single_node_is() -> None:
    idx = _idx(Node("a", 8), Node("b", 8))
    idx.take("a", 4)
    idx.take("b", 4)
    assert idx.free_gpus("default") == 8
    assert idx.find("default", 2, 4, constraint="pack") is None
    assert idx.find("default", 2, 4, constraint="any") == ("a", "b")


def test_pack_respects_cpu_and_memory_of_the_whole_gang() -> None:
    idx = _idx(Node("small", 4, cpu=4000, memory=100), Node("big", 8, cpu=64000, memory=1000))
    # GPU best fit is "small", but 2 replicas need 6000 millicores.
    assert idx.find("default", 2, 2, cpu=3000, constraint="pack") == ("big", "big")
    assert idx.find("default", 2, 2, cpu=2000, constraint="pack") == ("small", "small")
    assert idx.find("default", 2, 2, memory=60, constraint="pack") == ("big", "big")
    assert idx.find("default", 2, 2, memory=600, constraint="pack") is None


def test_untracked_cpu_and_memory_do_not_limit() -> None:
    idx = _idx(Node("tracked", 8, cpu=1000, memory=10), Node("untracked", 8))
    idx.take("tracked", 1)  # best fit on GPUs
    assert idx.find("default", 1, 1, cpu=500, memory=5, constraint="pack") == ("tracked",)
    assert idx.find("default", 1, 1, cpu=5000, constraint="pack") == ("untracked",)
    assert idx.find("default", 4, 1, memory=10**6, constraint="any") == ("untracked",) * 4
    idx.take("untracked", 2, cpu=10**9, memory=10**9)  # accepted, not recorded
    assert idx.free("untracked") == (6, 0, 0)


# --------------------------------------------------------------------------- block


def test_block_picks_block_with_fewest_free_gpus_that_hosts_the_gang() -> None:
    nodes = [
        Node("a1", 8, block="A"),
        Node("a2", 8, block="A"),
        Node("b1", 8, block="B"),
        Node("b2", 8, block="B"),
        Node("c1", 8, block="C"),
        Node("c2", 8, block="C"),
    ]
    idx = CapacityIndex(nodes)
    idx.take("a1", 8)  # A: 8 free
    idx.take("b1", 4)  # B: 12 free, best fit for 12
    assert idx.find("default", 3, 4, constraint="block") == ("b1", "b2", "b2")
    assert idx.find("default", 2, 4, constraint="block") == ("a2", "a2")
    assert idx.find("default", 2, 8, constraint="block") == ("c1", "c2")
    assert idx.find("default", 3, 8, constraint="block") is None


def test_block_skips_a_block_whose_total_is_enough_but_fragmented() -> None:
    nodes = [Node("a1", 8, block="A"), Node("a2", 8, block="A"), Node("b1", 8, block="B"), Node("b2", 8, block="B")]
    idx = CapacityIndex(nodes)
    idx.take("a1", 3)
    idx.take("a2", 3)  # A: 10 free as 5 + 5; cannot host 1 x 8
    idx.take("b1", 2)  # B: 14 free
    assert idx.largest_domain("default", "block") == 14
    assert idx.find("default", 1, 8, constraint="block") == ("b2",)
    assert idx.find("default", 2, 5, constraint="block") == ("a1", "a2")


def test_block_ties_by_block_order_and_best_fit_inside() -> None:
    nodes = [Node("x1", 4, block="X"), Node("y1", 8, block="Y"), Node("x2", 4, block="X")]
    idx = CapacityIndex(nodes)
    # X and Y both have 8 free; X first appears first.
    assert idx.find("default", 1, 2, constraint="block") == ("x1",)
    idx.take("x1", 1)  # X: 3 + 4 = 7 free -> X still fewest
    assert idx.find("default", 2, 2, constraint="block") == ("x1", "x2")
    assert idx.find("default", 2, 3, constraint="block") == ("x1", "x2")
    assert idx.find("default", 2, 4, constraint="block") == ("y1", "y1")


def test_node_without_block_is_its_own_block() -> None:
    nodes = [Node("solo", 4), Node("r1", 4, block="R"), Node("r2", 4, block="R")]
    idx = CapacityIndex(nodes)
    assert idx.block_of("solo") == "solo"
    assert idx.find("default", 2, 2, constraint="block") == ("solo", "solo")
    assert idx.find("default", 2, 4, constraint="block") == ("r1", "r2")
    assert idx.largest_domain("default", "block") == 8


def test_block_label_equal_to_a_node_name_does_not_merge() -> None:
    nodes = [Node("R", 4), Node("n1", 4, block="R")]
    idx = CapacityIndex(nodes)
    assert idx.largest_domain("default", "block") == 4
    assert idx.find("default", 2, 4, constraint="block") is None


def test_block_respects_cpu() -> None:
    nodes = [
        Node("a1", 8, cpu=1000, block="A"),
        Node("a2", 8, cpu=1000, block="A"),
        Node("b1", 8, cpu=8000, block="B"),
        Node("b2", 8, cpu=8000, block="B"),
    ]
    idx = CapacityIndex(nodes)
    idx.take("a1", 1)
    assert idx.find("default", 2, 4, cpu=1000, constraint="block") == ("a1", "a2")
    assert idx.find("default", 2, 4, cpu=2000, constraint="block") == ("b1", "b1")
    assert idx.find("default", 4, 2, cpu=3000, constraint="block") == ("b1", "b1", "b2", "b2")
    assert idx.find("default", 5, 2, cpu=3000, constraint="block") is None


# --------------------------------------------------------------------------- any


def test_any_places_each_replica_best_fit_greedily() -> None:
    idx = _idx(Node("a", 8), Node("b", 8), Node("c", 8))
    idx.take("a", 5)  # 3 free
    idx.take("c", 6)  # 2 free
    assert idx.find("default", 1, 2) == ("c",)
    assert idx.find("default", 3, 2) == ("c", "a", "b")
    assert idx.find("default", 6, 2) == ("c", "a", "b", "b", "b", "b")
    assert idx.find("default", 7, 2) is None  # 13 GPUs free, only 6 whole 2-GPU slots


def test_any_skips_nodes_short_of_cpu_or_memory() -> None:
    idx = _idx(
        Node("a", 4, cpu=1000, memory=100), Node("b", 8, cpu=8000, memory=100), Node("c", 8, cpu=8000, memory=1000)
    )
    assert idx.find("default", 2, 2, cpu=2000) == ("b", "b")
    assert idx.find("default", 5, 2, cpu=2000) == ("b", "b", "b", "b", "c")
    assert idx.find("default", 3, 1, memory=200) == ("c", "c", "c")
    assert idx.find("default", 9, 1, cpu=2000) is None


def test_flavors_never_mix() -> None:
    nodes = [Node("h1", 8, flavor="h100"), Node("a1", 8, flavor="a100"), Node("a2", 8, flavor="a100", block="B")]
    idx = CapacityIndex(nodes)
    assert idx.flavors() == ("a100", "h100")
    assert idx.flavor_of("a2") == "a100"
    assert idx.capacity_gpus("a100") == 16
    assert idx.capacity_gpus("h100") == 8
    assert idx.find("h100", 2, 8) is None
    assert idx.find("a100", 2, 8) == ("a1", "a2")
    assert idx.find("h100", 1, 8, constraint="pack") == ("h1",)
    assert idx.find("missing", 1, 1) is None
    assert idx.free_gpus("missing") == 0
    assert idx.capacity_gpus("missing") == 0
    assert idx.largest_domain("missing", "any") == 0
    idx.take("a1", 8)
    assert idx.free_gpus("a100") == 8
    assert idx.free_gpus("h100") == 8


def test_cpu_only_replicas_place_on_cpu_and_memory() -> None:
    idx = _idx(
        Node("g", 8, cpu=4000, memory=100), Node("c", 0, cpu=16000, memory=1000), Node("h", 8, cpu=4000, memory=100)
    )
    idx.take("h", 4)  # by free GPUs: c (0) < h (4) < g (8)
    assert idx.find("default", 1, 0, cpu=1000) == ("c",)
    assert idx.find("default", 2, 0, cpu=3000) == ("c", "c")
    assert idx.find("default", 1, 0, cpu=8000, constraint="pack") == ("c",)
    assert idx.find("default", 3, 0, cpu=4000, constraint="block") == ("c", "c", "c")
    assert idx.find("default", 7, 0, cpu=4000) is None
    assert idx.find("default", 6, 0, cpu=4000) == ("c", "c", "c", "c", "h", "g")
    assert idx.find("default", 5, 0) == ("c",) * 5
    assert idx.find("default", 1, 0, memory=1001) is None
    idx.take("c", 0, 16000)
    assert idx.find("default", 1, 0, cpu=1000) == ("h",)
    assert idx.find("default", 2, 0, cpu=3000, constraint="block") is None
    assert idx.find("default", 2, 0, cpu=3000) == ("h", "g")


# --------------------------------------------------------------------------- changes


def test_take_and_give_errors_change_nothing() -> None:
    nodes = [Node("a", 8, cpu=1000, memory=100)]
    idx = CapacityIndex(nodes)
    with pytest.raises(ValueError):
        idx.take("a", 9)
    with pytest.raises(ValueError):
        idx.take("a", 1, cpu=1001)
    with pytest.raises(ValueError):
        idx.take("a", 1, memory=101)
    with pytest.raises(ValueError):
        idx.give("a", 1)
    with pytest.raises(ValueError):
        idx.take("a", -1)
    with pytest.raises(KeyError):
        idx.take("nope", 1)
    assert idx.free("a") == (8, 1000, 100)
    idx.take("a", 8, 1000, 100)
    assert idx.free("a") == (0, 0, 0)
    assert idx.free_gpus("default") == 0
    with pytest.raises(ValueError):
        idx.take("a", 1)
    idx.give("a", 3, 500, 50)
    with pytest.raises(ValueError):
        idx.give("a", 0, 501)
    assert idx.free("a") == (3, 500, 50)


def test_place_takes_per_replica_and_is_all_or_nothing() -> None:
    idx = _idx(Node("a", 8, cpu=4000), Node("b", 8, cpu=4000))
    idx.place(("a", "a", "b"), 2, cpu=1000)
    assert idx.free("a") == (4, 2000, 0)
    assert idx.free("b") == (6, 3000, 0)
    with pytest.raises(ValueError):
        idx.place(("b", "a", "a", "a"), 2, cpu=1000)  # a cannot take 3 more cpu-wise
    assert idx.free("a") == (4, 2000, 0)
    assert idx.free("b") == (6, 3000, 0)


def test_constructor_rejects_duplicates_and_negative_capacity() -> None:
    with pytest.raises(ValueError):
        _idx(Node("a", 8), Node("a", 4))
    with pytest.raises(ValueError):
        _idx(Node("a", -1))


def test_find_validates_arguments() -> None:
    idx = _idx(Node("a", 8))
    with pytest.raises(ValueError):
        idx.find("default", 0, 1)
    with pytest.raises(ValueError):
        idx.find("default", 1, -1)
    with pytest.raises(ValueError):
        idx.find("default", 1, 1, constraint="rack")
    with pytest.raises(ValueError):
        idx.largest_domain("default", "rack")


def test_find_does_not_change_the_index() -> None:
    nodes = [Node(f"n{i}", 8, cpu=8000, block=f"b{i % 2}") for i in range(4)]
    idx = CapacityIndex(nodes)
    before = _snapshot(idx, nodes)
    for c in CONSTRAINTS:
        assert idx.find("default", 3, 2, cpu=1000, constraint=c) is not None
    assert _snapshot(idx, nodes) == before
    assert idx.free_gpus("default") == 32


# --------------------------------------------------------------------------- marks


def _answers(idx: CapacityIndex) -> list[tuple[str, ...] | None]:
    return [idx.find("default", r, g, constraint=c) for c in CONSTRAINTS for r in (1, 2, 3) for g in (1, 4, 8)]


def test_nested_mark_and_rollback_restore_exactly() -> None:
    nodes = [Node(f"n{i}", 8, cpu=8000, memory=64, block=f"b{i // 2}") for i in range(4)]
    idx = CapacityIndex(nodes)
    idx.take("n0", 3, 1000, 8)
    s0, a0 = _snapshot(idx, nodes), _answers(idx)
    outer = idx.mark()
    idx.take("n1", 8, 8000, 64)
    idx.give("n0", 1, 500, 4)
    s1, a1 = _snapshot(idx, nodes), _answers(idx)
    inner = idx.mark()
    idx.place(("n2", "n2", "n3"), 4)
    idx.take("n3", 1, 100)
    assert _snapshot(idx, nodes) != s1
    idx.rollback(inner)
    assert _snapshot(idx, nodes) == s1
    assert _answers(idx) == a1
    idx.take("n2", 2)  # the inner mark stays usable after a rollback
    idx.rollback(inner)
    assert _snapshot(idx, nodes) == s1
    idx.rollback(outer)
    assert _snapshot(idx, nodes) == s0
    assert _answers(idx) == a0
    assert idx.free_gpus("default") == 29
    assert idx.largest_domain("default", "block") == 16


def test_rollback_to_a_discarded_mark_is_an_error() -> None:
    idx = _idx(Node("a", 8))
    outer = idx.mark()
    idx.take("a", 1)
    inner = idx.mark()
    idx.take("a", 1)
    idx.rollback(outer)
    with pytest.raises(ValueError):
        idx.rollback(inner)
    with pytest.raises(ValueError):
        idx.rollback(12345)
    assert idx.free("a") == (8, 0, 0)


def test_release_keeps_changes_and_outer_marks() -> None:
    idx = _idx(Node("a", 8))
    outer = idx.mark()
    inner = idx.mark()  # same state as outer
    assert inner != outer
    idx.take("a", 2)
    idx.release(inner)
    assert idx.free("a") == (6, 0, 0)
    with pytest.raises(ValueError):
        idx.rollback(inner)
    idx.rollback(outer)  # still open
    assert idx.free("a") == (8, 0, 0)
    idx.release(outer)
    with pytest.raises(ValueError):
        idx.rollback(outer)
    idx.take("a", 1)
    later = idx.mark()
    assert later not in (outer, inner)  # tokens are never reused
    idx.take("a", 1)
    idx.rollback(later)
    assert idx.free("a") == (7, 0, 0)


def test_stale_token_is_caught_even_at_the_same_log_position() -> None:
    idx = _idx(Node("a", 8))
    first = idx.mark()
    idx.take("a", 1)
    second = idx.mark()
    idx.rollback(first)  # discards `second`
    idx.take("a", 1)  # the log is as long again as when `second` was made
    third = idx.mark()
    with pytest.raises(ValueError):
        idx.rollback(second)
    idx.take("a", 1)
    idx.rollback(third)
    assert idx.free("a") == (7, 0, 0)


def test_repeated_try_and_roll_back_keeps_marks_compact() -> None:
    idx = _idx(Node("a", 8))
    tokens = []
    for _ in range(1000):
        t = idx.mark()
        idx.take("a", 3)
        idx.rollback(t)
        tokens.append(t)
    assert len(set(tokens)) == 1000
    assert len(idx._marks) == 1  # one run of consecutive marks at the same position
    idx.rollback(tokens[-1])
    idx.release(tokens[0])
    assert idx._marks == [] and idx._log == []
    assert idx.free("a") == (8, 0, 0)


def test_infeasible_answer_is_revisited_when_capacity_returns() -> None:
    """Remembered failures must not outlive a give or a rollback that frees capacity."""
    nodes = [Node("a", 8, block="A"), Node("b", 8, block="A")]
    idx = CapacityIndex(nodes)
    idx.take("a", 4)
    idx.take("b", 4)
    assert idx.find("default", 1, 8, constraint="block") is None
    assert idx.find("default", 1, 6) is None
    idx.give("a", 2)
    assert idx.find("default", 1, 6) == ("a",)
    idx.take("a", 2)
    token = idx.mark()
    idx.take("a", 2)
    assert idx.find("default", 1, 6) is None
    assert idx.find("default", 4, 2) is None  # a: 2 free, b: 4 free
    idx.rollback(token)
    assert idx.find("default", 4, 2) == ("a", "a", "b", "b")
    assert idx.find("default", 1, 8, constraint="block") is None
    idx.give("b", 4)
    assert idx.find("default", 1, 8, constraint="block") == ("b",)


def test_failure_found_after_a_mark_is_forgotten_on_rollback() -> None:
    nodes = [Node("a1", 8, block="A"), Node("a2", 8, block="A"), Node("a3", 8, block="A"), Node("b1", 8, block="B")]
    idx = CapacityIndex(nodes)
    idx.take("a2", 5)
    idx.take("a3", 5)
    token = idx.mark()
    idx.take("a1", 4)
    idx.take("b1", 4)
    # A has 10 free and B 4; the flavor holds two 4-GPU slots, but no block holds both.
    assert idx.find("default", 2, 4, constraint="block") is None
    idx.check()
    idx.rollback(token)
    # A has 14 free again, B 8: B is the best-fitting block that hosts 2 x 4.
    assert idx.find("default", 2, 4, constraint="block") == ("b1", "b1")
    idx.check()


def test_failure_is_forgotten_when_capacity_is_given_back() -> None:
    nodes = [Node("a1", 8, block="A"), Node("a2", 8, block="A"), Node("a3", 8, block="A"), Node("b1", 8, block="B")]
    idx = CapacityIndex(nodes)
    for name, n in (("a1", 4), ("a2", 5), ("a3", 5), ("b1", 4)):
        idx.take(name, n)
    assert idx.find("default", 2, 4, constraint="block") is None
    assert idx.find("default", 2, 2, cpu=1, constraint="block") == ("b1", "b1")
    idx.give("b1", 4)
    assert idx.find("default", 2, 4, constraint="block") == ("b1", "b1")


def test_failure_is_forgotten_when_only_cpu_is_given_back() -> None:
    idx = _idx(Node("a", 8, cpu=4000), Node("b", 8, cpu=4000))
    idx.take("a", 0, cpu=3500)
    idx.take("b", 8)  # b keeps its cpu, so no quick reject on the flavor's largest free cpu
    assert idx.find("default", 1, 1, cpu=1000) is None
    idx.give("a", 0, cpu=3500)
    assert idx.find("default", 1, 1, cpu=1000) == ("a",)


def test_one_huge_node_pool() -> None:
    """The simulator's `--gpus N` mode is one node with every GPU."""
    idx = _idx(Node("pool", 2816))
    assert idx.find("default", 300, 8) == ("pool",) * 300
    assert idx.find("default", 1, 2816, constraint="pack") == ("pool",)
    idx.take("pool", 2810)
    assert idx.find("default", 1, 8, constraint="block") is None
    assert idx.find("default", 3, 2) == ("pool",) * 3
    assert idx.largest_domain("default", "pack") == 6


# --------------------------------------------------------------------------- domains, indices


def test_largest_domain_per_constraint() -> None:
    nodes = [Node("a1", 8, block="A"), Node("a2", 8, block="A"), Node("s", 4)]
    idx = CapacityIndex(nodes)
    assert idx.largest_domain("default", "pack") == 8
    assert idx.largest_domain("default", "block") == 16
    assert idx.largest_domain("default", "any") == 20
    idx.take("a1", 6)
    idx.take("a2", 3)
    assert idx.largest_domain("default", "pack") == 5
    assert idx.largest_domain("default", "block") == 7
    assert idx.largest_domain("default", "any") == 11
    idx.take("a2", 5)
    assert idx.largest_domain("default", "pack") == 4
    assert idx.largest_domain("default", "block") == 4


def test_assign_gpu_indices() -> None:
    assert assign_gpu_indices(8, 0, 3) == ((0, 1, 2), 0b111)
    assert assign_gpu_indices(8, gpu_mask({0, 2, 3}), 3) == ((1, 4, 5), gpu_mask({1, 4, 5}))
    assert assign_gpu_indices(8, gpu_mask([7, 0]), 6)[0] == (1, 2, 3, 4, 5, 6)
    assert assign_gpu_indices(4, gpu_mask([1, 1]), 0) == ((), 0)
    assert assign_gpu_indices(4096, gpu_mask(range(4000)), 3)[0] == (4000, 4001, 4002)
    with pytest.raises(ValueError, match="3 GPU indices wanted, 2 free of 4"):
        assign_gpu_indices(4, gpu_mask([0, 1]), 3)
    with pytest.raises(ValueError, match="outside range"):
        assign_gpu_indices(4, gpu_mask([4]), 1)
    with pytest.raises(ValueError, match="negative"):
        assign_gpu_indices(4, 0, -1)


def test_same_calls_same_answers() -> None:
    def run() -> list[object]:
        nodes = [Node(f"n{i}", 8, cpu=8000, block=f"b{i % 3}") for i in range(9)]
        idx = CapacityIndex(nodes)
        out: list[object] = []
        for step in range(40):
            c = CONSTRAINTS[step % 3]
            got = idx.find("default", 1 + step % 3, 1 + step % 8, cpu=500 * (step % 4), constraint=c)
            out.append(got)
            if got is not None and step % 2:
                idx.place(got, 1 + step % 8, cpu=500 * (step % 4))
        return out

    assert run() == run()


# --------------------------------------------------------------------------- property test


class _Model:
    """Brute-force reference: plain dicts, no indexes."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.free = {n.name: (n.gpus, n.cpu, n.memory) for n in nodes}
        self.pos = {n.name: i for i, n in enumerate(nodes)}
        self.by_name = {n.name: n for n in nodes}

    def block(self, name: str) -> tuple[bool, str]:
        n = self.by_name[name]
        return (True, n.name) if n.block is None else (False, n.block)

    def fits(self, name: str, k: int, g: int, c: int, m: int) -> bool:
        """Can `name` host k replicas of (g, c, m) now? 0 cpu/memory capacity: unlimited."""
        n = self.by_name[name]
        fg, fc, fm = self.free[name]
        return k * g <= fg and (n.cpu == 0 or k * c <= fc) and (n.memory == 0 or k * m <= fm)

    def valid(self, names: tuple[str, ...], flavor: str, r: int, g: int, c: int, m: int, constraint: str) -> bool:
        if len(names) != r or any(self.by_name[x].flavor != flavor for x in names):
            return False
        if constraint == "pack" and len(set(names)) != 1:
            return False
        if constraint == "block" and len({self.block(x) for x in names}) != 1:
            return False
        return all(self.fits(x, k, g, c, m) for x, k in Counter(names).items())

    def feasible(self, flavor: str, r: int, g: int, c: int, m: int, constraint: str) -> bool:
        """Enumerate every multiset of r nodes of the flavor."""
        cands = [n.name for n in self.nodes if n.flavor == flavor]
        return any(
            self.valid(combo, flavor, r, g, c, m, constraint) for combo in combinations_with_replacement(cands, r)
        )

    def greedy(self, cands: list[str], r: int, g: int, c: int, m: int) -> tuple[str, ...] | None:
        """The spec, literally: each replica on the fitting node with fewest free GPUs."""
        saved = dict(self.free)
        out: list[str] = []
        try:
            for _ in range(r):
                fit = [x for x in cands if self.fits(x, 1, g, c, m)]
                if not fit:
                    return None
                best = min(fit, key=lambda x: (self.free[x][0], self.pos[x]))
                n = self.by_name[best]
                fg, fc, fm = self.free[best]
                self.free[best] = (fg - g, fc - c if n.cpu else fc, fm - m if n.memory else fm)
                out.append(best)
            return tuple(out)
        finally:
            self.free = saved

    def expected(self, flavor: str, r: int, g: int, c: int, m: int, constraint: str) -> tuple[str, ...] | None:
        cands = [n.name for n in self.nodes if n.flavor == flavor]
        if constraint == "pack":
            fit = [x for x in cands if self.fits(x, r, g, c, m)]
            if not fit:
                return None
            best = min(fit, key=lambda x: (self.free[x][0], self.pos[x]))
            return (best,) * r
        if constraint == "any":
            return self.greedy(cands, r, g, c, m)
        blocks: dict[tuple[bool, str], list[str]] = {}
        for x in cands:
            blocks.setdefault(self.block(x), []).append(x)
        order = sorted(blocks.values(), key=lambda xs: (sum(self.free[x][0] for x in xs), self.pos[xs[0]]))
        for xs in order:
            got = self.greedy(xs, r, g, c, m)
            if got is not None:
                return got
        return None


_FLAVORS = ("a", "b")


@st.composite
def _nodes(draw: st.DrawFn) -> list[Node]:
    count = draw(st.integers(1, 7))
    out = []
    for i in range(count):
        out.append(
            Node(
                name=f"n{i}",
                gpus=draw(st.sampled_from([0, 1, 2, 4, 8])),
                cpu=draw(st.sampled_from([0, 2, 4, 8])),
                memory=draw(st.sampled_from([0, 3, 6])),
                flavor=draw(st.sampled_from(_FLAVORS)),
                block=draw(st.sampled_from([None, "r1", "r2"])),
            )
        )
    return out


class PlacementMachine(RuleBasedStateMachine):
    @initialize(nodes=_nodes())
    def setup(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.idx = CapacityIndex(nodes)
        self.model = _Model(nodes)
        self.marks: list[tuple[int, dict[str, tuple[int, int, int]]]] = []
        self.shapes: list[tuple[str, int, int, int, int, str]] = []

    def _node(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from([n.name for n in self.nodes]))

    @rule(data=st.data(), g=st.integers(0, 5), c=st.integers(0, 5), m=st.integers(0, 4))
    def take(self, data: st.DataObject, g: int, c: int, m: int) -> None:
        name = self._node(data)
        if self.model.fits(name, 1, g, c, m):
            self.idx.take(name, g, c, m)
            n = self.model.by_name[name]
            fg, fc, fm = self.model.free[name]
            self.model.free[name] = (fg - g, fc - c if n.cpu else fc, fm - m if n.memory else fm)
        else:
            with pytest.raises(ValueError):
                self.idx.take(name, g, c, m)

    @rule(data=st.data(), g=st.integers(0, 5), c=st.integers(0, 5), m=st.integers(0, 4))
    def give(self, data: st.DataObject, g: int, c: int, m: int) -> None:
        name = self._node(data)
        n = self.model.by_name[name]
        fg, fc, fm = self.model.free[name]
        dc, dm = (c if n.cpu else 0), (m if n.memory else 0)
        if fg + g <= n.gpus and fc + dc <= n.cpu and fm + dm <= n.memory:
            self.idx.give(name, g, c, m)
            self.model.free[name] = (fg + g, fc + dc, fm + dm)
        else:
            with pytest.raises(ValueError):
                self.idx.give(name, g, c, m)

    @rule(
        flavor=st.sampled_from(_FLAVORS),
        r=st.integers(1, 4),
        g=st.sampled_from([0, 1, 1, 2, 2, 3, 4]),
        c=st.sampled_from([0, 1, 2, 3]),
        m=st.sampled_from([0, 0, 1, 2]),
        constraint=st.sampled_from(CONSTRAINTS),
        keep=st.booleans(),
    )
    def find(self, flavor: str, r: int, g: int, c: int, m: int, constraint: str, keep: bool) -> None:
        if (flavor, r, g, c, m, constraint) not in self.shapes:
            self.shapes.append((flavor, r, g, c, m, constraint))
        before = dict(self.model.free)
        got = self.idx.find(flavor, r, g, c, m, constraint)
        assert {x: self.idx.free(x) for x in before} == before  # find changes nothing
        feasible = self.model.feasible(flavor, r, g, c, m, constraint)
        if got is None:
            assert not feasible, (flavor, r, g, c, m, constraint)
        else:
            assert self.model.valid(got, flavor, r, g, c, m, constraint), got
        # The exact best-fit choice, as the spec describes it replica by replica.
        assert got == self.model.expected(flavor, r, g, c, m, constraint)
        if got is not None and keep:
            self.idx.place(got, g, c, m)
            for x in got:
                n = self.model.by_name[x]
                fg, fc, fm = self.model.free[x]
                self.model.free[x] = (fg - g, fc - c if n.cpu else fc, fm - m if n.memory else fm)

    @precondition(lambda self: bool(self.shapes))
    @rule(data=st.data(), keep=st.booleans())
    def find_again(self, data: st.DataObject, keep: bool) -> None:
        """Repeat an earlier query: remembered failures must still be right after changes."""
        shape = data.draw(st.sampled_from(self.shapes))
        self.find(*shape, keep=keep)

    @rule()
    def mark(self) -> None:
        self.marks.append((self.idx.mark(), dict(self.model.free)))

    @precondition(lambda self: bool(self.marks))
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        j = data.draw(st.integers(0, len(self.marks) - 1))
        token, saved = self.marks[j]
        self.idx.rollback(token)
        del self.marks[j + 1 :]  # the mark itself stays open
        self.model.free = dict(saved)

    @precondition(lambda self: bool(self.marks))
    @rule()
    def release_last(self) -> None:
        token, _ = self.marks.pop()
        self.idx.release(token)

    @invariant()
    def totals_match_a_recount(self) -> None:
        if not hasattr(self, "idx"):
            return
        for x in self.model.free:
            assert self.idx.free(x) == self.model.free[x]
        for fl in _FLAVORS:
            names = [n.name for n in self.nodes if n.flavor == fl]
            frees = [self.model.free[x][0] for x in names]
            assert self.idx.free_gpus(fl) == sum(frees)
            assert self.idx.capacity_gpus(fl) == sum(self.model.by_name[x].gpus for x in names)
            assert self.idx.largest_domain(fl, "any") == sum(frees)
            assert self.idx.largest_domain(fl, "pack") == max(frees, default=0)
            per_block = Counter[tuple[bool, str]]()
            for x in names:
                per_block[self.model.block(x)] += self.model.free[x][0]
            assert self.idx.largest_domain(fl, "block") == max(per_block.values(), default=0)
        assert self.idx.flavors() == tuple(sorted({n.flavor for n in self.nodes}))
        self.idx.check()  # every internal index agrees with a recount


TestPlacementMachine = PlacementMachine.TestCase
TestPlacementMachine.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
