"""Before a run: is the lab that is up the one the manifest states (its ``lab`` section)?

A lab manifest's figures hold for the lab it states (hosts, CPU shares and mode); run on
another, they are figures of another experiment. :func:`check_lab` compares the two before
any device is touched and refuses the run with the differences and the ``tracr lab up``
command for the stated lab, or, with ``lab.on_mismatch: record``, lets it go on; either
way the run records what it found (:func:`lab_check`, ``summary.json`` ``lab_check``).

A manifest whose participants are all off the lab (``--set
participant_instances.edge-1.device=localhost``) does not use the lab, and is not checked.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from app_api import lab
from app_api.lab import requirement, timeline, verify
from app_api.lab.verify import lab_health
from experiment_design.errors import TracrError


def uses_lab(manifest: Any) -> bool:
    """Whether any participant of ``manifest`` runs on a lab host (a device ``lab-N``)."""
    devices = {inst.get("device") or "" for inst in manifest.participant_instances}
    return any(d.startswith("lab-") and d[4:].isdigit() for d in devices)


def lab_check(manifest: Any) -> dict | None:
    """What the run records of the lab check (None: the manifest states no lab).

    ``{wanted, differences, ok, used, lab_up}``; ``used`` is False when no participant
    runs on the lab (then nothing was compared).
    """
    spec = requirement.LabSpec.from_section(manifest.lab)
    if spec is None:
        return None
    record: dict = {"wanted": asdict(spec),
                    "lab_up": requirement.up_command(spec, manifest.network)}
    if not uses_lab(manifest):
        record.update(used=False, differences=[], ok=True)
        return record
    state = lab.load_state()
    diffs = requirement.differences(spec, state)
    record.update(used=True, differences=diffs, ok=not diffs)
    return record


def check_lab(manifest: Any) -> dict | None:
    """Refuse (exit 2) a run whose lab differs from the stated one, unless the manifest
    says ``lab.on_mismatch: record``; returns :func:`lab_check`'s record.

    A run on the lab is also refused when a lab helper died (the link emulator, the CPU
    pacer: :func:`app_api.lab.verify.lab_health`) or the lab's last ``tracr lab verify``
    failed (:func:`app_api.lab.verify.require_verified`, with its figures);
    ``lab.on_mismatch: record`` overrides the latter.
    """
    if uses_lab(manifest):
        section = manifest.lab or {}
        verify.require_verified(force=section.get("on_mismatch") == "record")
    record = lab_check(manifest)
    if record is None or record["ok"]:
        return record
    if record["wanted"]["on_mismatch"] == "record":
        return record
    raise TracrError(
        f"the lab that is up is not the one {manifest.name} states: "
        + requirement.describe(record["differences"]),
        hint=f"bring up the stated lab ('sudo tracr lab down', then '{record['lab_up']}', or "
        f"'sudo tracr lab up --manifest {manifest.name}'), or run on this lab and record the "
        "differences: --set lab.on_mismatch=record",
    )


def lab_health_errors(manifest: Any) -> list[str]:
    """Why the lab could not carry a run that used it (a dead link emulator or pacer),
    for the end of a run that lost a participant; [] when all is well or off the lab."""
    if not uses_lab(manifest):
        return []

    return lab_health()


def record_link(manifest: Any, run_dir, t0: float, t1: float) -> None:
    """Write ``link.csv`` into ``run_dir``: the lab link's configured state from ``t0`` to
    ``t1`` (wall times; :func:`app_api.lab.timeline.link_timeline`), so every inference
    can be matched to the rate, delay and loss it met. Nothing off the lab."""
    from pathlib import Path

    if not uses_lab(manifest) or run_dir is None or not Path(run_dir).is_dir():
        return
    rows = timeline.link_timeline(t0, t1)
    if rows:
        (Path(run_dir) / "link.csv").write_text(timeline.to_csv(rows))
