"""The lab a manifest states it needs, and how the lab that is up differs from it.

A lab manifest's figures come from the lab it ran on: how many hosts, which of them
are slowed and how (the CPU share and the mode: a CFS ``quota`` or the ``duty``
pacer), the pinning. A manifest states that lab in its ``lab`` section::

    lab:
      hosts: 2
      cpu: {lab-1: 0.25}       # host -> share of one core; hosts not named are unlimited
      cpu_mode: duty           # quota | duty
      cpu_period_ms: null      # null: the mode's default
      memory: {lab-1: 600MB}   # host -> memory cap; hosts not named are uncapped
      pin: true
      on_mismatch: refuse      # refuse | record

The link (rate, delay, loss, trace) is the ``network`` section's, which the run shapes
itself. Before a device is touched the run compares the lab that is up with the stated one
(:func:`differences`): a difference refuses the run with the figures and the ``tracr lab
up`` command that brings up the stated lab (:func:`up_command`), or, with
``on_mismatch: record``, the run goes on and ``summary.json`` says what differed
(``lab_check``). ``tracr lab up --manifest NAME`` brings up exactly the stated lab.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from app_api.units import parse_size

#: the share of a core two figures may differ by and still be the same quota
_SHARE_TOL = 1e-6


@dataclass(frozen=True)
class LabSpec:
    """The lab a manifest needs (its ``lab`` section, validated by the schema)."""

    hosts: int
    cpu: dict[str, float] = field(default_factory=dict)
    cpu_mode: str = "quota"
    cpu_period_ms: float | None = None
    memory: dict[str, str] = field(default_factory=dict)
    pin: bool = True
    on_mismatch: str = "refuse"

    @classmethod
    def from_section(cls, section: dict | None) -> LabSpec | None:
        """The spec of a manifest's ``lab`` section (None: the manifest states no lab)."""
        if not section:
            return None
        return cls(
            hosts=int(section["hosts"]),
            cpu={str(k): float(v) for k, v in (section.get("cpu") or {}).items()},
            cpu_mode=str(section.get("cpu_mode") or "quota"),
            cpu_period_ms=(None if section.get("cpu_period_ms") is None
                           else float(section["cpu_period_ms"])),
            memory={str(k): str(v) for k, v in (section.get("memory") or {}).items()},
            pin=bool(section.get("pin", True)),
            on_mismatch=str(section.get("on_mismatch") or "refuse"),
        )

    def up_kwargs(self, network: dict | None = None) -> dict[str, Any]:
        """Keyword arguments of :func:`app_api.lab.up` that bring up this lab, with the
        ``network`` section's first rate and its delay as the link it starts with."""
        net = dict(network or {})
        rates = net.get("bandwidths") or []
        kwargs: dict[str, Any] = {
            "hosts": self.hosts,
            "bandwidth": net.get("bandwidth") or (rates[0] if rates else None),
            "cpu_quota": {h: share for h, share in self.cpu.items()},
            "cpu_period_ms": self.cpu_period_ms,
            "cpu_mode": self.cpu_mode,
            "pin": self.pin,
        }
        if self.memory:
            kwargs["memory"] = dict(self.memory)
        if net.get("delay_ms"):
            kwargs["delay_ms"] = float(net["delay_ms"])
        kwargs.update(link_args(net))
        return kwargs


def link_args(network: dict | None) -> dict:
    """The link beyond rate and delay that a manifest's ``network`` section asks for, as
    :func:`app_api.lab.up` and :func:`app_api.lab.shape` take it (``{}``: none)."""
    net = dict(network or {})
    out: dict = {}
    if net.get("jitter_ms"):
        out["jitter"] = float(net["jitter_ms"])
    if net.get("loss_pct"):
        out["loss"] = f"{float(net['loss_pct']):g}%"
    if net.get("trace"):
        out["trace"] = str(net["trace"])
    return out


def stated_lab(name: str) -> tuple[str, dict | None, dict]:
    """``(experiment name, lab section, network section)`` of manifest ``name``, each
    checked by the schema, without validating the rest: its participants name lab hosts
    that exist only once the lab it states is up (``tracr lab up --manifest``)."""
    # the manifest package loads PyYAML: not at tracr --help, which imports this module
    from app_api.manifest.errors import ManifestError
    from app_api.manifest.schema import SCHEMA, SchemaProblem, validate
    from app_api.manifest.search import find_manifest
    from app_api.manifest.yamlio import load_yaml_file

    path = find_manifest(name)
    data, _ = load_yaml_file(path)
    if not isinstance(data, dict):
        raise ManifestError("a manifest must be a mapping", file=str(path))
    sections = []
    for key in ("lab", "network"):
        try:
            sections.append(validate(data.get(key), SCHEMA.keys[key], (key,)))
        except SchemaProblem as exc:
            raise ManifestError(f"{'.'.join(map(str, exc.path))}: {exc.message}",
                                file=str(path), hint=exc.hint) from None
    return path.stem, sections[0], sections[1] or {}


def up_command(spec: LabSpec, network: dict | None = None) -> str:
    """The ``tracr lab up`` command line that brings up ``spec``'s lab."""
    kw = spec.up_kwargs(network)
    parts = ["sudo tracr lab up", f"--hosts {kw['hosts']}"]
    if kw["bandwidth"]:
        parts.append(f"--bandwidth {kw['bandwidth']}")
    if kw.get("delay_ms"):
        parts.append(f"--delay {kw['delay_ms']:g}ms")
    if kw.get("jitter"):
        parts.append(f"--jitter {kw['jitter']:g}ms")
    if kw.get("loss"):
        parts.append(f"--loss {kw['loss']}")
    if kw.get("trace"):
        parts.append(f"--trace {kw['trace']}")
    if kw["cpu_quota"]:
        parts.append("--cpu-quota " + " ".join(f"{h}={s:g}" for h, s in kw["cpu_quota"].items()))
        parts.append(f"--cpu-mode {kw['cpu_mode']}")
        if kw["cpu_period_ms"] is not None:
            parts.append(f"--cpu-period-ms {kw['cpu_period_ms']:g}")
    if kw.get("memory"):
        parts.append("--memory " + " ".join(f"{h}={v}" for h, v in kw["memory"].items()))
    if not kw["pin"]:
        parts.append("--no-pin")
    return " ".join(parts)


def differences(spec: LabSpec, state: dict | None) -> list[dict]:
    """How the lab that is up (its state, None: no lab) differs from ``spec``.

    One ``{what, wanted, found}`` per difference; empty when the lab is the stated one.
    A host the spec does not name must be unlimited; a quota'd host must run in the
    stated mode (and at the stated period, when one is stated).
    """
    if not state or not state.get("hosts"):
        return [{"what": "hosts", "wanted": spec.hosts, "found": 0}]
    hosts = {h["name"]: h for h in state["hosts"]}
    out: list[dict] = []
    if len(hosts) != spec.hosts:
        out.append({"what": "hosts", "wanted": spec.hosts, "found": len(hosts)})
    for name in sorted(set(spec.cpu) - set(hosts)):
        out.append({"what": f"{name}", "wanted": "a lab host", "found": "none"})
    out += _memory_differences(spec, hosts)
    for name, h in sorted(hosts.items()):
        wanted = spec.cpu.get(name)
        found = h.get("cpu_quota")
        if wanted is None and found is None:
            continue
        if wanted is None or found is None or abs(float(found) - wanted) > _SHARE_TOL:
            out.append({"what": f"{name} cpu", "wanted": _share(wanted), "found": _share(found)})
            continue
        mode = h.get("cpu_mode") or "quota"
        if mode != spec.cpu_mode:
            out.append({"what": f"{name} cpu mode", "wanted": spec.cpu_mode, "found": mode})
        if spec.cpu_period_ms is not None:
            period_ms = float(h.get("cpu_period_us") or 0) / 1000
            if abs(period_ms - spec.cpu_period_ms) > 1e-9:
                out.append({"what": f"{name} cpu period", "wanted": f"{spec.cpu_period_ms:g} ms",
                            "found": f"{period_ms:g} ms"})
    # lab up pins only where each host can have a CPU of its own: with more hosts than CPUs
    # a lab that asked for pinning is unpinned, and that is the stated lab on this machine
    can_pin = spec.hosts <= machine_cpus()
    if len(hosts) == spec.hosts and bool(state.get("pinned")) != (spec.pin and can_pin):
        out.append({"what": "pinned", "wanted": spec.pin and can_pin,
                    "found": bool(state.get("pinned"))})
    return out


def _memory_differences(spec: LabSpec, hosts: dict[str, dict]) -> list[dict]:
    """A host's memory cap against the stated one (a host not named: uncapped)."""
    out = []
    for name, h in sorted(hosts.items()):
        wanted = parse_size(spec.memory[name]) if name in spec.memory else None
        found = h.get("memory_bytes")
        if wanted != (None if found is None else int(found)):
            out.append({"what": f"{name} memory", "wanted": _bytes(wanted),
                        "found": _bytes(found)})
    return out


def _bytes(v: int | None) -> str:
    return "uncapped" if v is None else f"{int(v) / 1e6:g} MB"


def machine_cpus() -> int:
    """The CPUs this process may use (what lab up pins hosts to)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def _share(v: float | None) -> str:
    return "unlimited" if v is None else f"{float(v):g} core"


def describe(diffs: list[dict]) -> str:
    """One line per difference: ``lab-1 cpu mode: wanted duty, found quota``."""
    return "; ".join(f"{d['what']}: wanted {d['wanted']}, found {d['found']}" for d in diffs)
