"""The memory of unprepares made while prepares run: enough for "unprepare wins", and
bounded by the prepares in flight (it once kept every unprepare for ten minutes and
walked them all on each call)."""

from __future__ import annotations

from dradriver.kubeletplugin.prepare.preparer import UnpreparedMeanwhile


def test_an_unprepare_during_a_prepare_is_seen_by_it() -> None:
    m = UnpreparedMeanwhile()
    token, began = m.prepare_began()
    m.unprepared("a")
    assert m.since("a", began) and not m.since("b", began)
    m.prepare_ended(token)
    assert len(m) == 0  # no prepare left that could care


def test_nothing_is_kept_while_no_prepare_runs() -> None:
    m = UnpreparedMeanwhile()
    for i in range(1000):
        m.unprepared(f"c{i}")
    assert len(m) == 0
    _, began = m.prepare_began()
    assert not m.since("c1", began)  # it began after them all


def test_a_prepare_never_sees_an_unprepare_from_before_it() -> None:
    m = UnpreparedMeanwhile()
    long_running, _ = m.prepare_began()
    m.unprepared("a")
    _, began = m.prepare_began()
    assert not m.since("a", began)
    m.prepare_ended(long_running)


def test_memory_is_bounded_by_the_oldest_running_prepare() -> None:
    m = UnpreparedMeanwhile()
    first, _ = m.prepare_began()
    m.unprepared("old")
    second, began = m.prepare_began()
    m.prepare_ended(first)
    # The next unprepare drops what no running prepare began before.
    m.unprepared("new")
    assert len(m) == 1 and m.since("new", began)
    # Churn while one prepare runs keeps one entry per claim, not per call.
    for _ in range(500):
        m.unprepared("new")
    assert len(m) == 1
    m.prepare_ended(second)
    assert len(m) == 0
