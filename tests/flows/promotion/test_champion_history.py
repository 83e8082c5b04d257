"""The champion history as an append-only log (flows.promotion.champion.champion_timeline): what a
rollback returns to after any sequence of gate promotions, operator promotions, rollbacks
and crashes between the history write and the alias move."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flows.promotion import champion

move = st.tuples(st.sampled_from(["gate", "promote", "rollback", "crash"]),
                 st.integers(1, 6))


def replay(moves):
    """Apply ``moves`` the way the gate, promote and rollback do: each appends a row with
    the version taking the alias and the one it came from; a crash appends a row and
    never moves the alias. Rollback moves to the holder before the current one, computed
    here from the holders seen so far (not by the code under test)."""
    history, holder, held = [], None, []
    for how, version in moves:
        if how == "rollback":
            earlier = [v for v in held if v != holder]
            if not earlier:
                continue
            version = earlier[-1]
        if how != "crash" and version == holder:
            continue
        history.append({"version": version, "from": holder,
                        "how": "gate" if how == "crash" else how})
        if how != "crash":
            holder = version
            held.append(version)
    return history, holder, held


@settings(max_examples=300)
@given(st.lists(move, max_size=25))
def test_timeline_ends_at_the_holder_and_keeps_every_move(moves):
    history, holder, held = replay(moves)
    timeline = champion.champion_timeline(history, None if holder is None else str(holder))
    assert timeline == [str(v) for v in held]


def test_a_second_rollback_undoes_the_first_and_nothing_is_deleted():
    """The issue's sequence: v1 by the gate, v2 promoted by hand, rolled back to v1; the
    history keeps all three rows, and the next rollback target is v2 again."""
    history = [{"version": "1", "from": None, "how": "gate"},
               {"version": "2", "from": "1", "how": "promote"},
               {"version": "1", "from": "2", "how": "rollback"}]
    assert champion.champion_timeline(history, "1") == ["1", "2", "1"]
    assert champion.champion_timeline(history[:2], "2") == ["1", "2"]
    # A champion from before the history, and a row whose alias move never happened.
    assert champion.champion_timeline([{"version": "5", "from": "4", "how": "gate"},
                                   {"version": "6", "from": "5", "how": "gate"}],
                                  "5") == ["4", "5"]
    assert champion.champion_timeline([], "3") == ["3"]
    assert champion.champion_timeline(history, None) == []


def test_the_rollback_target_skips_the_holder_and_versions_deleted_since():
    rows = [{"version": "1", "from": None}, {"version": "2", "from": "1"},
            {"version": "3", "from": "2"}]
    assert champion.rollback_target(rows, "3", lambda v: True) == "2"
    assert champion.rollback_target(rows, "3", lambda v: v != "2") == "1"
    assert champion.rollback_target(rows, "3", lambda v: v == "3") is None
    assert champion.rollback_target(rows, "1", lambda v: True) is None
    assert champion.rollback_target(rows, None, lambda v: True) is None
    # a rollback row put v2 back: the timeline repeats it; the target is never the holder
    again = [*rows, {"version": "2", "from": "3"}]
    assert champion.rollback_target(again, "2", lambda v: True) == "3"


def test_history_text_that_is_not_a_list_of_rows_reads_as_no_history():
    assert champion.parse_history(None) == [] and champion.parse_history("") == []
    assert champion.parse_history("{not json") == []
    assert champion.parse_history('{"version": "1"}') == []
    assert champion.parse_history('[{"version": "1"}, {"from": "1"}, 3]') == [{"version": "1"}]
