"""The figures a language model's placement over lab hosts is planned from, measured on
the lab that is up: each host's decode costs under its own CPU quota and memory cap, the
link's rate and round trip, and each host's memory cap.

- decode costs: :mod:`experiment_design.runtime.decode_probe` runs once per host, one
  host at a time, as a process in that host's memory cgroup from its start (the cap
  binds its set-up too) and, once set up (imports, the probe model, the prefill at full
  speed), moved into the host's CPU cgroup, where it times its decode steps: the quota
  the host's participants run under. A host with no cgroup runs it unlimited.
- the link: the rate and round trip the lab measured through its shaped links when it
  came up (``tracr lab up`` proves its links; :func:`app_api.lab.link_report`).
- memory caps: the lab's state (``memory_bytes``, :mod:`app_api.lab.memory`).

:func:`host_from_probe`, :func:`link_from_report` and :func:`model_facts` turn them into
:mod:`experiment_design.partitioners.llm_placement`'s inputs (pure, but for the model's
shapes, which :func:`model_facts` reads from its meta-device skeleton).
"""

from __future__ import annotations

import json
import math
import os
import select
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import experiment_design
from app_api.lab import cgroup
from experiment_design.errors import TracrError
from experiment_design.models.llm import llm_skeleton
from experiment_design.partitioners.llm_placement import Host, Link, Model
from experiment_design.runtime.decode_probe import DecodeProbe

#: how long a probe may take to set itself up, and then to measure (s)
SETUP_S = 300.0
MEASURE_S = 300.0


@dataclass(frozen=True)
class HostFacts:
    """One lab host as the placement sees it: its name, CPU quota (None: unlimited),
    memory cap (None: uncapped) and what its decode probe measured."""

    name: str
    cpu_quota: float | None
    cap_bytes: int | None
    probe: DecodeProbe

    def to_dict(self) -> dict:
        """Plain JSON view (the probe's samples left out)."""
        p = self.probe
        return {"name": self.name, "cpu_quota": self.cpu_quota, "cap_bytes": self.cap_bytes,
                "layer_ms": p.layer_ms, "embed_ms": p.embed_ms, "head_ms": p.head_ms,
                "runtime_bytes": p.runtime_bytes}


def host_from_probe(facts: HostFacts, layers: int) -> Host:
    """A placement :class:`Host` from a host's measured figures: every one of the
    model's ``layers`` decoder layers costs the probe's ``layer_ms`` (they have one
    shape), the ends its ``embed_ms`` and ``head_ms``; the process's runtime counts
    against the cap beside the weights and KV cache."""
    p = facts.probe
    return Host(facts.name, (float(p.layer_ms),) * int(layers), float(p.embed_ms),
                float(p.head_ms), facts.cap_bytes, None, int(p.runtime_bytes))


def split_resolution(facts: list[HostFacts]) -> float:
    """The smallest relative difference in time per token these figures can tell apart:
    two standard errors of the least certain host's per-layer median (its samples'
    spread, from their interquartile range, over the square root of their number), as a
    fraction of that median. tracr's placement splits only when splitting saves more
    (``tracr_placement(split_margin=...)``)."""
    worst = 0.0
    for f in facts:
        s = sorted(f.probe.layer_samples)
        if len(s) < 4 or not f.probe.layer_ms:
            continue
        q1, q3 = s[len(s) // 4], s[(3 * len(s)) // 4]
        sigma = (q3 - q1) / 1.349  # the IQR of a normal distribution is 1.349 sigma
        se = 1.2533 * sigma / math.sqrt(len(s))  # the standard error of a median
        worst = max(worst, se / f.probe.layer_ms)
    return 2 * worst


def link_from_report(report: dict) -> Link:
    """The lab link as measured when it came up: ``bandwidth_Bps`` and ``rtt_ms``."""
    rate, rtt = report.get("bandwidth_Bps"), report.get("rtt_ms")
    if not rate or rtt is None:
        raise TracrError("the lab has no measured link (rate and round trip)",
                         hint="bring the lab up with its verification (tracr lab up "
                              "without --no-verify)")
    return Link(rate_bytes_per_s=float(rate), rtt_ms=float(rtt))


def model_facts(name: str) -> Model:
    """The model's per-layer weight and KV bytes, its ends' bytes and the bytes per token
    at a cut (one token's hidden state in fp32), from its meta-device skeleton."""
    # the split package loads torch: not at tracr --help, which imports this module
    from experiment_design.split.decoder import DecoderSplit

    sm = DecoderSplit(llm_skeleton(name), name=name)
    return Model.from_layer_facts(sm.layer_facts(), embed_bytes=sm.weight_bytes(0, 0),
                                  head_bytes=sm.weight_bytes(sm.n, sm.n), hidden=sm.hidden)


def _probe_cmd(model: str, *, layers: int, context: int, steps: int, seed: int) -> list[str]:
    return [sys.executable, "-m", "experiment_design.runtime.decode_probe", model,
            "--layers", str(layers), "--context", str(context), "--steps", str(steps),
            "--seed", str(seed)]


def _readline(proc: subprocess.Popen, timeout: float, what: str) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TracrError(f"{what}: no answer within {timeout:.0f} s")
    return proc.stdout.readline().strip()  # type: ignore[union-attr]


def probe_host(host: dict, model: str, *, layers: int = 2, context: int = 512,
               steps: int = 12, seed: int = 0) -> HostFacts:
    """Run the decode probe in lab host ``host``'s cgroups (its state entry): the
    memory cgroup from the start, the CPU cgroup once it is set up (module docstring)."""
    cmd = _probe_cmd(model, layers=layers, context=context, steps=steps, seed=seed)
    mem = host.get("memory_cgroup")
    if mem:  # into the cap before the interpreter starts: its whole memory is charged there
        cmd = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(mem), *cmd]
    env = dict(os.environ)
    root = str(Path(experiment_design.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    what = f"the decode probe on {host['name']}"
    # stderr to a file: a pipe nobody reads until the end fills with warnings and blocks
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err, text=True, env=env)
    try:
        line = _readline(proc, SETUP_S, what)
        if line != "ready":
            raise TracrError(f"{what} failed to set up: {line or _tail(proc, err)}")
        if host.get("cgroup"):
            cgroup.add_pid(Path(host["cgroup"]), proc.pid)
        proc.stdin.write("go\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        out = _readline(proc, MEASURE_S, what)
        if not out.startswith("{"):
            raise TracrError(f"{what} failed: {out or _tail(proc, err)}")
    finally:
        if proc.poll() is None:  # its figures are in: its exit is no part of them
            proc.kill()
        proc.wait()
        err.close()
    return HostFacts(host["name"], host.get("cpu_quota"), host.get("memory_bytes"),
                     DecodeProbe.from_dict(json.loads(out)))


def _tail(proc: subprocess.Popen, err: Any) -> str:
    """The end of a failed probe's stderr (``err``, its file)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    err.seek(0)
    return err.read().strip()[-600:] or f"(exit {proc.returncode}, no stderr)"


def probe_hosts(state: dict, model: str, *, layers: int = 2, context: int = 512,
                steps: int = 12, seed: int = 0, say=lambda msg: None) -> list[HostFacts]:
    """Every lab host's figures, one host at a time (the others idle), in the lab's
    host order."""
    out = []
    for h in state.get("hosts") or []:
        say(f"probing {h['name']}'s decode step ({model}, {layers} layers, "
            f"{context}-token context)")
        out.append(probe_host(h, model, layers=layers, context=context, steps=steps,
                              seed=seed))
    return out
