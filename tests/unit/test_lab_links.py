"""The lab link's mechanism choice, netem arguments, timeline and verify's arithmetic."""

from __future__ import annotations

import json

import pytest

from app_api.lab import links, network, timeline, verify
from app_api.lab.pipe import LinkConfig
from experiment_design.errors import TracrError


@pytest.fixture
def netem(monkeypatch):
    def have(value: bool):
        monkeypatch.setitem(network._QDISC_CACHE, "netem", value)
    return have


def _spec(**kw):
    return links.link_spec(["lab-1", "lab-2"], links.direction_config(**kw))


def test_mechanism_by_what_is_asked_and_what_the_kernel_has(netem):
    netem(False)
    assert links.choose_mechanism(_spec()) is None
    assert links.choose_mechanism(_spec(bandwidth="16Mbit")) == "tbf"
    assert links.choose_mechanism(_spec(bandwidth="16Mbit", delay="20ms", loss="1%")) == "user"
    assert links.choose_mechanism(_spec(bandwidth="16Mbit"), "user") == "user"
    with pytest.raises(TracrError, match="no netem"):
        links.choose_mechanism(_spec(delay="20ms"), "netem")
    netem(True)
    assert links.choose_mechanism(_spec(delay="20ms")) == "netem"
    assert links.choose_mechanism(_spec(bandwidth="1MB/s", trace="walk")) == "user"
    ingress = links.link_spec(["lab-1"], LinkConfig(), {("lab-1", "down"):
                                                         links.direction_config(delay="5")})
    assert links.choose_mechanism(ingress) == "user"
    with pytest.raises(TracrError, match="egress"):
        links.choose_mechanism(ingress, "netem")


def test_netem_arguments():
    cfg = links.direction_config(bandwidth="16Mbit", delay="20ms", jitter="2ms",
                                 jitter_dist="normal", loss="1%")
    assert links.netem_args(cfg)[:9] == ["netem", "delay", "20ms", "2ms", "distribution",
                                         "normal", "loss", "random", "1%"]
    assert "16000000bit" in links.netem_args(cfg)
    ge = links.netem_args(links.direction_config(loss_model="ge:1%,30%"))
    assert ge[1:7] == ["loss", "gemodel", "1%", "30%", "100%", "0%"]


def test_time_and_overrides():
    assert links.parse_ms("20ms", "d") == 20
    assert links.parse_ms("0.5s", "d") == 500
    assert links.parse_ms(3, "d") == 3
    with pytest.raises(TracrError):
        links.parse_ms("soon", "d")
    spec = links.link_spec(["lab-1", "lab-2"], LinkConfig(delay_ms=20),
                           {("lab-2", "down"): LinkConfig(loss=0.02)})
    assert spec["lab-1"]["up"].delay_ms == 20 and spec["lab-2"]["down"].loss == 0.02
    with pytest.raises(TracrError, match="no link lab-3"):
        links.link_spec(["lab-1"], LinkConfig(), {("lab-3", "up"): LinkConfig()})
    assert links.describe(LinkConfig(rate_Bps=2e6, delay_ms=20, loss=0.01)) == \
        "2 MB/s (16 Mbit/s), 20 ms, loss 1%"


def test_timeline_state_at_the_start_then_each_change(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [{"t": 10.0, "link": "lab-1", "dir": "up", "event": "start", "rate_Bps": 1e6},
            {"t": 15.0, "link": "lab-1", "dir": "up", "event": "step", "rate_Bps": 2e6},
            {"t": 25.0, "link": "lab-1", "dir": "up", "event": "step", "rate_Bps": 3e6},
            {"t": 40.0, "link": "lab-1", "dir": "up", "event": "step", "rate_Bps": 4e6}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"t\": 41, cut")
    got = timeline.link_timeline(20.0, 30.0, path)
    assert [(r["t"], r["rate_Bps"], r["event"]) for r in got] == [
        (20.0, 2e6, "in effect"), (25.0, 3e6, "step")]
    csv = timeline.to_csv(got)
    assert csv.splitlines()[0].startswith("t,link,dir,event")
    assert len(csv.splitlines()) == 3


def test_binomial_interval_and_loss_check():
    lo, hi = verify.binomial_interval(10_000, 0.01)
    assert (lo, hi) in {(80, 120), (81, 120), (80, 119), (81, 119)}
    assert verify.binomial_interval(10_000, 0.0) == (0, 0)
    # bursty loss: the same mean, a wider interval
    glo, ghi = verify.loss_interval(10_000, LinkConfig(ge=(0.01 / 0.99 * 0.3, 0.3, 0.0, 1.0)))
    assert glo < lo and ghi > hi


def test_a_failed_verify_refuses_a_run_unless_forced():
    rows = [{"check": "round trip", "link": "lab-1 <-> lab-2", "configured": 40,
             "measured": 55.0, "ok": False, "note": ""}]
    state = {"hosts": [], "verify": {"ok": False, "rows": rows}}
    with pytest.raises(TracrError, match="configured 40, measured 55.0"):
        verify.require_verified(state)
    assert verify.require_verified(state, force=True)["ok"] is False
    assert verify.require_verified({"hosts": []}) is None


def test_a_dead_emulator_is_named():
    state = {"hosts": [], "emulator": {"pid": 2**22 + 12345, "log": "/x/emulator.log"}}
    dead = verify.lab_health(state)
    assert len(dead) == 1 and "link emulator (pid" in dead[0] and "cut off" in dead[0]
    with pytest.raises(TracrError, match="link emulator"):
        verify.require_verified(state)


def test_a_goodput_read_low_is_measured_again_and_the_best_kept():
    cfg = LinkConfig(rate_Bps=2e6)
    plan = {"messages": [64 << 10], "loss": [[100, 1e5]], "pings": 0}

    def session(stretch: float) -> dict:
        arrivals = [[i, 100 + stretch * i * 1514 / 2e6, 1472] for i in range(45)]
        return {"msgs": {"1": arrivals}, "loss_sent": {"1": 100}, "loss": {"1": 100}}

    rows: list = []
    verify._direction(rows, session(1.2), "lab-1 up", cfg, plan, None)
    assert rows[0]["ok"] is False and rows[1]["check"] == "loss"
    asked = []
    verify._again(rows, "lab-1 up", cfg, plan, None,
                  lambda p: asked.append(p) or session(1.0))
    assert len(asked) == 1 and asked[0]["loss"] == []  # only the messages again
    assert rows[0]["ok"] is True
    assert rows[0]["measured"] == pytest.approx(2e6 * 1472 / 1514, rel=1e-6)
    assert rows[0]["note"].endswith("(best of 2)") and len(rows[0]["readings"]) == 2


def _trace_message(tmp_path, per_ms: int, late_s: float, delay_ms: float = 0.0) -> dict:
    """A 64 KiB probe message through the emulator's own rate stage (:class:`Pipe`) on a
    Mahimahi trace of ``per_ms`` opportunities each ms, sent as verify's sender sends it
    (a burst, then a quarter faster than the link); the emulator sends each frame 20-100
    us late, and the burst holding the first timed frame ``late_s`` late."""
    import math
    import random

    from app_api.lab import udpprobe
    from app_api.lab.pipe import Pipe

    path = tmp_path / f"{per_ms}.trace"
    path.write_text("".join(f"{ms}\n" * per_ms for ms in range(1, 201)))
    pipe = Pipe(LinkConfig(trace=str(path), delay_ms=delay_ms), epoch=1000.0)
    n, rate = 45, 1.25 * per_ms * 1514e3
    burst = max(8, math.ceil(0.004 * rate / 1.25 / 1514))
    sizes = [1472] * (n - 1) + [65536 - 1472 * (n - 1)]
    start = 1005.5 + 0.37e-3
    departs = [pipe.offer(start + max(0, i - burst) * 1514 / rate + 2e-6 * i, size + 42)
               for i, size in enumerate(sizes)]
    k = udpprobe.skip_count(n, per_ms * 1514e3)
    rng = random.Random(0)
    # the emulator stalls at the first timed frame's burst and then sends, in order,
    # everything that fell due meanwhile (the next burst with it)
    stall = (departs[k - 1], departs[k - 1] + late_s)
    sent, arrivals = 0.0, []
    for i, (d, size) in enumerate(zip(departs, sizes, strict=True)):
        sent = max(sent, (stall[1] if stall[0] <= d < stall[1] else d) + rng.uniform(2e-5, 1e-4))
        arrivals.append([i, sent, size])
    return {"msgs": {"1": arrivals}, "loss_sent": {}, "loss": {}}


@pytest.mark.parametrize("late_s", [0.0, 2.5e-3])
@pytest.mark.parametrize("delay_ms", [0.0, 20.0])
def test_a_trace_links_goodput_counts_its_opportunities_not_one_late_burst(tmp_path, late_s,
                                                                            delay_ms):
    """A Mahimahi link sends in bursts at its ms opportunities; a 64 KiB message lasts ~8
    of them at 4 per ms. Timed from one arrival to the last it read 1.5% low when all
    went well, and 12.6% high when the emulator stalled 2.5 ms at the first timed burst
    (a full suite once failed on a 14% reading); counted in the trace's opportunities it
    reads the link's rate. Fails on the code before (timed by arrivals)."""
    plan = {"messages": [64 << 10], "loss": []}
    rows: list = []
    cfg = LinkConfig(trace=str(tmp_path / "4.trace"), delay_ms=delay_ms)
    out = _trace_message(tmp_path, 4, late_s, delay_ms)
    verify._direction(rows, out, "lab-1 up", cfg, plan, 1000.0)
    assert rows[0]["ok"] is True, rows
    assert rows[0]["measured"] == pytest.approx(4 * 1472e3, rel=0.01)


def test_a_trace_link_that_sends_more_than_its_trace_is_still_caught(tmp_path):
    """An emulator giving 5 frames where the trace has 4 opportunities reads 25% high."""
    _trace_message(tmp_path, 4, 0.0)  # writes the configured 4-per-ms trace
    rows: list = []
    verify._direction(rows, _trace_message(tmp_path, 5, 0.0), "lab-1 up",
                      LinkConfig(trace=str(tmp_path / "4.trace")),
                      {"messages": [64 << 10], "loss": []}, 1000.0)
    assert rows[0]["ok"] is False
    assert rows[0]["measured"] / rows[0]["configured"] == pytest.approx(1.25, rel=0.02)


def test_per_host_overrides_from_a_request():
    from app_api.lab import shaping

    request = shaping.link_request("16Mbit", "20ms", loss="1%",
                                   overrides={"lab-2:down": {"delay": "5ms", "loss": "2%"}})
    spec, mode = shaping.request_spec(request, ["lab-1", "lab-2"])
    assert mode == "auto"
    assert spec["lab-1"]["up"].delay_ms == 20 and spec["lab-1"]["up"].loss == 0.01
    assert spec["lab-2"]["down"].delay_ms == 5 and spec["lab-2"]["down"].loss == 0.02
    assert spec["lab-1"]["down"].is_empty()
    bad = shaping.link_request(overrides={"lab-2:down": {"latency": "5ms"}})
    with pytest.raises(TracrError, match="unknown key 'latency'"):
        shaping.request_spec(bad, ["lab-1", "lab-2"])


def test_a_pinger_waiting_for_a_delayed_echo_still_times_an_early_one():
    """The verify pinger blocks until just before the configured delay has passed, then
    polls: an echo that comes sooner (a link missing its delay) wakes it, so it is timed
    as it came, not as the delay the pinger expected."""
    from app_api.lab import udpprobe

    plan = {**verify._ping_plan(20, delays_ms=200.0), "messages": [], "drain_s": [],
            "pace_Bps": 0, "loss": [], "end_wait_s": 0.05}
    assert plan["ping_wait_s"] == pytest.approx(0.1995) and plan["ping_spin_s"] > 0
    out = udpprobe.session(None, None, "127.0.0.1", plan, 30)
    assert out["ping_lost"] == 0 and len(out["rtts_ms"]) == 20
    assert max(out["rtts_ms"]) < 50  # loopback: never the 199.5 ms the pinger expected
