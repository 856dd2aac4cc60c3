"""A thread's current branch (SPEC §12, ``core.branches``), as a pure function of its runs: a plain
run goes on from the run before it, a regenerate or a resend of X from where X started, a fork
from the run (or the start of the run) it names."""

from __future__ import annotations

import pytest

from chamvi_runs.core.branches import Node, current_branch, parents

pytestmark = pytest.mark.timeout(30)


def plain(*ids: str) -> list[Node]:
    return [Node(i) for i in ids]


def test_a_thread_without_runs_has_an_empty_branch():
    assert current_branch([]) == []
    assert parents([]) == {}


def test_plain_runs_each_go_on_from_the_one_before():
    runs = plain("a", "b", "c")
    assert parents(runs) == {"a": None, "b": "a", "c": "b"}
    assert current_branch(runs) == ["a", "b", "c"]


def test_a_regenerate_of_the_latest_run_takes_its_place():
    runs = [*plain("a", "b", "c"), Node("c2", replaces="c")]
    assert parents(runs)["c2"] == "b"
    assert current_branch(runs) == ["a", "b", "c2"]


def test_the_run_after_a_regenerate_goes_on_from_the_new_run():
    runs = [*plain("a", "b"), Node("b2", replaces="b"), Node("c")]
    assert parents(runs)["c"] == "b2"
    assert current_branch(runs) == ["a", "b2", "c"]


def test_a_resend_of_an_earlier_run_drops_every_run_after_it():
    runs = [*plain("a", "b", "c", "d"), Node("b2", replaces="b")]
    assert current_branch(runs) == ["a", "b2"]
    # The thread goes on from there; the dropped runs never come back.
    runs.append(Node("e"))
    assert current_branch(runs) == ["a", "b2", "e"]


def test_a_regenerate_of_the_first_run_starts_a_branch_of_its_own():
    runs = [Node("a"), Node("a2", replaces="a")]
    assert parents(runs)["a2"] is None
    assert current_branch(runs) == ["a2"]


def test_the_same_run_regenerated_twice_keeps_the_newest_answer():
    runs = [*plain("a", "b"), Node("b2", replaces="b"), Node("b3", replaces="b")]
    assert current_branch(runs) == ["a", "b3"]


def test_regenerating_a_regenerated_run_goes_on_from_where_both_started():
    # b3 starts from the history b2 started from, which is a's: b is on no branch.
    runs = [*plain("a", "b"), Node("b2", replaces="b"), Node("b3", replaces="b2")]
    assert parents(runs)["b3"] == "a"
    assert current_branch(runs) == ["a", "b3"]


def test_a_fork_after_a_step_goes_on_from_the_run_it_names():
    runs = [*plain("a", "b", "c"), Node("f", forked_from="b")]
    assert parents(runs)["f"] == "b"
    assert current_branch(runs) == ["a", "b", "f"]


def test_a_fork_from_the_start_of_a_run_goes_on_from_the_run_before_it():
    runs = [*plain("a", "b", "c"), Node("f", forked_from="b", from_start=True)]
    assert parents(runs)["f"] == "a"
    assert current_branch(runs) == ["a", "f"]


def test_a_fork_from_the_start_of_a_replacement_goes_on_from_where_it_started():
    runs = [*plain("a", "b"), Node("b2", replaces="b"), Node("f", forked_from="b2", from_start=True)]
    assert current_branch(runs) == ["a", "f"]


def test_a_fork_of_a_run_of_another_thread_starts_the_branch():
    runs = [*plain("a", "b"), Node("f", forked_from="elsewhere")]
    assert parents(runs)["f"] is None
    assert current_branch(runs) == ["f"]


def test_a_replaced_run_of_another_thread_counts_as_a_plain_run():
    runs = [*plain("a", "b"), Node("c", replaces="elsewhere")]
    assert current_branch(runs) == ["a", "b", "c"]


def test_runs_before_the_newest_off_its_branch_are_not_on_it():
    # After a fork of a, the branch is a's and the fork's: b and c are on another branch.
    runs = [*plain("a", "b", "c"), Node("f", forked_from="a")]
    assert current_branch(runs) == ["a", "f"]
    assert set(parents(runs)) == {"a", "b", "c", "f"}


def test_a_parent_cycle_ends_the_branch_instead_of_looping():
    # Not a thread the store can produce (a run names only older runs), but the walk stays finite.
    runs = [Node("a", forked_from="b"), Node("b", forked_from="a")]
    branch = current_branch(runs)
    assert branch[-1] == "b" and set(branch) <= {"a", "b"} and len(branch) == 2
