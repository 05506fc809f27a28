"""`tracr bench deploy`: time zero-deploy of a cloud+edge pair, and its teardown.

``ready_s`` runs from the first SSH connection to both participants answering
``hello()`` over their tunnels (both deployed concurrently, as the runner does);
``teardown_s`` from ``stop()`` to both processes and temp dirs gone. Each
repeat is a full cold deploy into fresh temp dirs; medians are reported with
every sample. With no device named, a throwaway sshd on 127.0.0.1 stands in
for two devices (or the built-in localhost when sshd is missing).

Phases per participant (``phases_last_round``): ``ssh_s`` login until the
ControlMaster is up, ``ship_s`` bundle unpacked and venv made on the device,
``participant_s`` the participant's start-up (mostly ``import torch``),
``connect_s`` port forward through the master plus the authenticated rpyc
connection. The load average is reported before and after: on a shared
machine the torch import, and so ``ready_s``, grows with it.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from app_api.devices import get_device
from app_api.devices.loopback import SSHD, start_loopback_sshd
from app_api.launch import ParticipantSpec, launcher_for
from app_api.launch.bundle import build_bundle

TARGET_READY_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `tracr bench deploy`."""
    parser.add_argument("targets", nargs="*", metavar="DEVICE",
                        help="cloud device, then edge device (default: a loopback sshd)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="cold deploys to time (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per participant")


def _launchers(targets: list[str]):
    cloud, edge = (targets + targets)[:2] if targets else ("", "")
    return [
        (role, name, launcher_for(get_device(name)))
        for role, name in (("cloud", cloud), ("edge", edge))
    ]


def _one_round(launchers, threads: int) -> dict:
    def start(item):
        role, name, launcher = item
        spec = ParticipantSpec(instance=f"{role}-1", role=role, device=name, threads=threads,
                               secret=secrets.token_bytes(32))  # fmt: skip
        handle = launcher.start(spec)
        try:
            handle.conn.root.hello()
        except BaseException:
            handle.stop()
            raise
        return handle

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(launchers)) as pool:
        futures = [pool.submit(start, item) for item in launchers]
        handles, errors = [], []
        for f in futures:
            try:
                handles.append(f.result())
            except BaseException as exc:  # keep tearing down what did start
                errors.append(exc)
    ready = time.perf_counter() - t0
    t1 = time.perf_counter()
    with ThreadPoolExecutor(max(1, len(handles))) as pool:
        list(pool.map(lambda h: h.stop(), handles))
    teardown = time.perf_counter() - t1
    if errors:
        raise errors[0]
    leftovers = [f"{h.instance}: {item}" for h in handles for item in h.leftovers()]
    phases = {
        h.instance: {k: round(v, 4) for k, v in getattr(h, "timings", {}).items()} for h in handles
    }
    return {"ready_s": ready, "teardown_s": teardown, "leftovers": leftovers, "phases": phases}


def run(args: argparse.Namespace) -> dict:
    """Deploy a cloud+edge pair ``--repeats`` times; medians of ready and teardown times."""
    import os

    repeats = max(1, int(getattr(args, "repeats", 3)))
    load_before = os.getloadavg()[0]  # context: other work on the same cores slows torch import
    targets = list(getattr(args, "targets", []) or [])
    sshd = None
    if not targets:
        if os.path.exists(SSHD):
            sshd = start_loopback_sshd()
        else:
            targets = ["localhost"]
    try:
        if sshd is not None:
            dev = sshd.device("loopback")
            launchers = [(r, dev.name, launcher_for(dev)) for r in ("cloud", "edge")]
            where = f"loopback sshd {sshd.host}:{sshd.port}"
        else:
            launchers = _launchers(targets)
            where = ", ".join(f"{r}={n}" for r, n, _ in launchers)
        t = time.perf_counter()
        bundle = build_bundle()
        bundle_s = time.perf_counter() - t
        rounds = [
            _one_round(launchers, int(getattr(args, "threads", 1) or 1)) for _ in range(repeats)
        ]
    finally:
        if sshd is not None:
            sshd.stop()
    load_after = os.getloadavg()[0]
    ready = [r["ready_s"] for r in rounds]
    teardown = [r["teardown_s"] for r in rounds]
    leftovers = sorted({x for r in rounds for x in r["leftovers"]})
    med = statistics.median(ready)
    return {
        "devices": where,
        "repeats": repeats,
        "observer_load_1m_before": round(load_before, 2),
        "observer_load_1m_after": round(load_after, 2),
        "ready_s": round(med, 3),
        "ready_s_samples": [round(x, 3) for x in ready],
        "target_ready_s": TARGET_READY_S,
        "ready_within_target": med <= TARGET_READY_S,
        "teardown_s": round(statistics.median(teardown), 3),
        "teardown_s_samples": [round(x, 3) for x in teardown],
        "bundle_bytes": len(bundle),
        "bundle_build_s": round(bundle_s, 3),
        "phases_last_round": rounds[-1]["phases"],
        "leftovers": leftovers,
        "clean": not leftovers,
        "exit_code": 0 if not leftovers else 1,
    }
