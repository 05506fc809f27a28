"""Trace-driven link rates: Mahimahi and CSV files, the shipped traces, the rate stage."""

from __future__ import annotations

import pytest

from app_api.lab import trace
from app_api.lab.pipe import LinkConfig, Pipe
from experiment_design.errors import TracrError


def test_mahimahi_opportunities_and_repetition(tmp_path):
    path = tmp_path / "link.trace"
    path.write_text("1\n1\n3\n10\n")  # two opportunities at 1 ms, one at 3, one at 10
    sched = trace.load(str(path))
    assert isinstance(sched, trace.Opportunities)
    assert sched.period == 0.010
    assert sched.before(0.001) == 0
    assert sched.before(0.002) == 2 * 1514
    assert sched.before(0.011) == 4 * 1514 + 0  # the next period's 1 ms not reached yet
    assert sched.before(0.0115) == 6 * 1514
    assert sched.time_of(1514) == pytest.approx(0.001)
    assert sched.time_of(3 * 1514) == pytest.approx(0.003)
    assert sched.time_of(5 * 1514) == pytest.approx(0.011)


def test_mahimahi_rate_through_the_pipe():
    # 12 opportunities per ms: 12 * 1514 bytes/ms = 18.168 MB/s
    sched = trace.parse_mahimahi("\n".join(str(ms) for ms in range(1, 101) for _ in range(12)))
    pipe = Pipe(LinkConfig(), epoch=0.0)
    pipe.schedule = sched
    last = [pipe.offer(0.0, 1514) for _ in range(1200)][-1]
    assert last == pytest.approx(0.100)
    # a small packet uses part of an opportunity
    pipe2 = Pipe(LinkConfig(), epoch=0.0)
    pipe2.schedule = trace.parse_mahimahi("1\n2\n")
    assert [pipe2.offer(0.0, 500) for _ in range(4)] == pytest.approx([0.001] * 3 + [0.002])


def test_csv_with_units_header_and_comments(tmp_path):
    path = tmp_path / "rates.csv"
    path.write_text("time_s,Mbit\n# a comment\n0,8\n1,16\n2,4\n")
    sched = trace.load(str(path))
    assert isinstance(sched, trace.Piecewise)
    assert sched.period == 3.0
    assert sched.rate_at(0.5) == 1e6
    assert sched.rate_at(1.5) == 2e6
    assert sched.rate_at(3.5) == 1e6  # repeats
    assert sched.before(2.0) == pytest.approx(3e6)
    assert sched.time_of(3e6) == pytest.approx(2.0)
    assert sched.time_of(3.5e6) == pytest.approx(3.0)
    other = trace.parse_csv("0,2MB/s\n0.5,500kbit\n")
    assert other.rate_at(0.7) == 62_500


def test_csv_rate_with_an_outage_skips_it():
    sched = trace.parse_csv("0,1000\n1,0\n2,1000\n")
    assert sched.time_of(1500) == pytest.approx(2.5)


def test_bad_traces_say_why(tmp_path):
    with pytest.raises(TracrError, match="not a time in ms"):
        trace.parse_mahimahi("1\nx\n")
    with pytest.raises(TracrError, match="no rate"):
        trace.parse_csv("0\n")
    with pytest.raises(TracrError, match="cannot read the trace"):
        trace.load(str(tmp_path / "missing.csv"))
    with pytest.raises(TracrError, match="shipped ones"):
        trace.synthetic("square", 1e6)


@pytest.mark.parametrize("name", trace.SYNTHETIC)
def test_shipped_traces_are_deterministic_and_scaled(name):
    a, b = trace.synthetic(name, 2e6), trace.synthetic(name, 2e6)
    assert a.steps() == b.steps()
    rates = [r for _, r in a.steps()]
    if name == "walk":
        assert max(rates) / min(rates) > 3  # wide swings, bounded at 5x
        assert max(rates) / min(rates) <= 5.0 + 1e-9
    else:
        assert a.total / a.period == pytest.approx(2e6)


def test_schedule_needs_a_rate_for_a_shipped_trace():
    with pytest.raises(TracrError, match="--bandwidth"):
        trace.schedule(None, "sawtooth")
    assert trace.schedule(None, None) is None
    assert isinstance(trace.schedule(1e6, None), trace.FixedRate)
