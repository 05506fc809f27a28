"""The lab's link as asked, applied, measured and reported.

A request (:func:`link_request`: rate, delay, jitter, loss, queue, trace, per-host
overrides) is recorded in the state, so a run can put it back; :func:`request_spec` turns
it into the per-host, per-direction spec :mod:`app_api.lab.links` applies, and
:func:`apply_request` applies it and measures the link (:func:`verify_link`). ``tracr lab
up`` shapes through these once (:mod:`app_api.lab.lifecycle`); :func:`shape` re-shapes the
running lab under the link's lock; :func:`link_report` is what a run records of the link.
"""

from __future__ import annotations

import time

from app_api.lab import links
from app_api.lab.lock import WAIT_S, link_lock
from app_api.lab.probe import measure_link
from app_api.lab.state import load_state, save_state
from app_api.lab.system import require_root
from app_api.units import format_rate
from experiment_design.errors import TracrError


def link_request(bandwidth=None, delay_ms=None, *, jitter=None, jitter_dist: str = "uniform",
                 loss=None, loss_model: str | None = None, queue=None, trace: str | None = None,
                 link_mode: str = "auto", overrides: dict | None = None) -> dict:
    """The lab's link as asked (recorded in the state, so a run can put it back).

    ``overrides``: ``{"lab-2:down": {"delay": "5ms", ...}}``, per host and direction.
    """
    return {"bandwidth": None if bandwidth in (None, "") else str(bandwidth),
            "delay_ms": links.parse_ms(delay_ms, "delay") or None, "jitter": jitter,
            "jitter_dist": jitter_dist, "loss": loss, "loss_model": loss_model, "queue": queue,
            "trace": trace, "link_mode": link_mode or "auto", "overrides": overrides or {}}


def request_spec(request: dict, hosts: list[str]) -> tuple[dict, str]:
    """The link spec of ``request`` over ``hosts`` (:func:`app_api.lab.links.link_spec`) and its
    ``link_mode``; an override with an unknown key is refused with the valid ones."""
    keys = ("bandwidth", "jitter", "jitter_dist", "loss", "loss_model", "queue", "trace")
    egress = links.direction_config(delay=request.get("delay_ms"),
                                    **{k: request.get(k) for k in keys if k in request})
    overrides = {}
    for where, values in (request.get("overrides") or {}).items():
        host, _, direction = where.partition(":")
        unknown = sorted(set(values) - {*keys, "delay"})
        if unknown:
            raise TracrError(f"--link {where}: unknown key {unknown[0]!r}",
                             hint="keys: bandwidth, delay, jitter, jitter_dist, loss, "
                             "loss_model, queue, trace")
        overrides[(host, direction or "up")] = links.direction_config(**values)
    return links.link_spec(hosts, egress, overrides), request.get("link_mode") or "auto"


def apply_request(state: dict, request: dict, verify: bool, say) -> None:
    """Shape the lab's links as ``request`` asks, record it in ``state``, and (``verify``)
    measure the link."""
    spec, mode = request_spec(request, [h["name"] for h in state["hosts"]])
    mechanism = links.apply(state, spec, mode, say)
    egress = spec[state["hosts"][0]["name"]]["up"]
    state["shaping"] = {
        "bandwidth": request.get("bandwidth"),
        "bandwidth_Bps": egress.rate_Bps,
        "delay_ms": request.get("delay_ms"),
        "qdisc": mechanism,
        "mechanism": mechanism,
        "request": request,
        "where": "egress of every host (namespace end of its veth)"
        + ("; per-host overrides in links" if request.get("overrides") else ""),
    }
    state["measured"] = {}
    state.pop("verify", None)  # a new link: the last verify no longer holds
    save_state(state)
    if mechanism:
        say(f"shaping: {mechanism} " + ", ".join(
            f"{h['name']} {links.describe(spec[h['name']]['up'])}" for h in state["hosts"]))
    if verify:
        state["measured"] = verify_link(state)
        m = state["measured"]
        say(
            f"measured {m['src']} -> {m['dst']}: {format_rate(m['rate_Bps'])}, rtt {m['rtt_ms']:.3f} ms"
        )
        save_state(state)


def verify_link(state: dict) -> dict:
    """Measure rate and round trip between the first two hosts (or host 1 -> observer)."""
    hosts = state["hosts"]
    shaped = state.get("shaping", {}).get("bandwidth_Bps")
    seconds = 2.0 if shaped else 1.0
    if shaped and shaped < 200_000:
        seconds = 4.0  # slow links need longer for the steady state to dominate
    src = hosts[0]
    if len(hosts) >= 2:
        dst_name, dst_ns, dst_addr = hosts[1]["name"], hosts[1]["ns"], hosts[1]["address"]
    else:
        dst_name, dst_ns, dst_addr = "observer", None, state["bridge_address"]
    result = measure_link(src["ns"], dst_ns, dst_addr, seconds=seconds)
    # A shaped link cannot beat its rate, but a stalled machine can read far below it for
    # a whole probe. Probe again (twice at most) and keep the fastest reading, so one
    # stall does not hand the partitioners a wrong link; every reading is recorded.
    readings = [round(result["rate_Bps"])]
    while shaped and result["rate_Bps"] < 0.7 * shaped and len(readings) < 3:
        again = measure_link(src["ns"], dst_ns, dst_addr, seconds=seconds)
        readings.append(round(again["rate_Bps"]))
        if again["rate_Bps"] > result["rate_Bps"]:
            result = again
    result["rate_readings_Bps"] = readings
    result.update(
        src=src["name"], dst=dst_name, seconds=seconds, at=time.strftime("%Y-%m-%dT%H:%M:%S%z")
    )
    if shaped:
        result["rate_ratio"] = round(result["rate_Bps"] / shaped, 4)
    return result


def shape(
    bandwidth: str | float | None = None,
    delay_ms: float | None = None,
    *,
    verify: bool = True,
    say=lambda m: None,
    wait_s: float = WAIT_S,
    **link_args,
) -> dict:
    """Re-shape the running lab (None/None removes shaping) and re-measure; returns link_report().

    ``link_args`` as for :func:`up`; one not given keeps the lab's current value (``tracr
    lab shape`` gives them all). Holds the lab link's lock
    (:func:`app_api.lab.lock.link_lock`) while it shapes and measures; another holder is
    waited for at most ``wait_s`` seconds.
    """
    require_root()
    state = load_state()
    if not state or not state.get("hosts"):
        raise TracrError(
            "no tracr lab is up", hint="start one: tracr lab up --hosts 2 --bandwidth 4MB/s"
        )
    # what is not given is kept (a run that re-shapes the rate keeps the lab's loss model)
    current = (state.get("shaping") or {}).get("request") or {}
    for key in ("jitter", "jitter_dist", "loss", "loss_model", "queue", "trace", "link_mode",
                "overrides"):
        if key not in link_args and key in current:
            link_args[key] = current[key]
    request = link_request(bandwidth, delay_ms, **link_args)
    spec, mode = request_spec(request, [h["name"] for h in state["hosts"]])
    links.choose_mechanism(spec, mode)
    with link_lock(wait_s):
        state = load_state() or state  # re-read: another shaper may have finished meanwhile
        apply_request(state, request, verify, say)
    return link_report()


def link_report() -> dict:
    """The lab link as configured and as measured ({} when no lab is up).

    Top-level ``bandwidth_Bps``/``rtt_ms`` are the measured figures (the shape partitioners
    expect); ``configured`` and ``measured`` hold the details.
    """
    state = load_state()
    if not state:
        return {}
    measured = dict(state.get("measured") or {})
    return {
        "lab": True,
        "hosts": [h["name"] for h in state["hosts"]],
        "bandwidth_Bps": measured.get("rate_Bps"),
        "rtt_ms": measured.get("rtt_ms"),
        "configured": dict(state.get("shaping") or {}),
        "measured": measured,
        # per host and direction, and the last `tracr lab verify` (a run records both)
        "links": state.get("links"),
        "verify": state.get("verify"),
        "cpu": {
            h["name"]: {
                "quota": h.get("cpu_quota"),
                "measured": h.get("cpu_measured"),
                "mode": h.get("cpu_mode", "quota"),
                # labs brought up before the period was recorded used the old 100 ms default
                "period_us": h.get("cpu_period_us", 100_000),
                **({"measured_together": h["cpu_measured_together"]}
                   if h.get("cpu_measured_together") is not None else {}),
            }
            for h in state["hosts"]
            if h.get("cpu_quota") is not None
        },
        "cpus": {h["name"]: h.get("cpus") for h in state["hosts"]},
    }
