"""Planning ``tracr experiment run``: a manifest and its overrides become a list of runs.

::

    plan_runs(manifest)   # -> RunPlan(kind, runs)
      plain:  one run, the lab link (if any) left as it is
      shaped: one run over the lab link shaped to network.bandwidth
      sweep:  one run per rate in network.bandwidths, grouped in one directory

Each planned run carries its own validated manifest: a sweep derives one per rate
from the loaded manifest plus two overrides (``network.bandwidth=<rate>``,
``network.bandwidths=null``), so every rate is checked before any device is
touched and the file is read once. Plans are frozen and print as the runs they
stand for; :mod:`app_api.runner.execute` carries them out.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from app_api.lab import requirement
from app_api.manifest import Manifest, Override, derive_manifest, validate_data
from app_api.manifest.yamlio import load_yaml_file
from app_api.results import complete_rows
from experiment_design.errors import TracrError

PLAIN, SHAPED, SWEEP = "plain", "shaped", "sweep"


@dataclass(frozen=True)
class PlannedRun:
    """One run: its manifest and the rate to shape the lab link to first (None: leave it).

    ``subdir`` is where a sweep puts this run inside its group directory;
    ``resume_from`` the incomplete run directory this run continues (see :func:`plan_resume`).
    """

    manifest: Manifest
    bandwidth: str | None = None
    delay_ms: float | None = None
    subdir: str | None = None
    resume_from: Path | None = None
    #: the rest of the link the run asks for (``lab.shape``'s ``jitter``, ``loss``,
    #: ``trace``), from the manifest's ``network`` section
    link: dict = field(default_factory=dict)

    def __str__(self) -> str:
        link = f" over a lab link shaped to {self.bandwidth}" if self.bandwidth else ""
        where = f" -> {self.subdir}/" if self.subdir else ""
        resume = f", resuming {self.resume_from}" if self.resume_from else ""
        return f"run {self.manifest.name}{link}{where}{resume}"


@dataclass(frozen=True)
class RunPlan:
    """What ``tracr experiment run`` will do: ``kind`` (plain, shaped, sweep) and its runs."""

    kind: str
    manifest: Manifest
    runs: tuple[PlannedRun, ...]

    @property
    def bandwidths(self) -> list[str]:
        """The rates the plan shapes the lab link to, in order ([] for a plain run)."""
        return [r.bandwidth for r in self.runs if r.bandwidth is not None]

    def __str__(self) -> str:
        head = f"{self.kind} plan for {self.manifest.name}"
        if self.manifest.overrides:
            head += " (" + " ".join(f"--set {o}" for o in self.manifest.overrides) + ")"
        return "\n".join([head, *(f"  {r}" for r in self.runs)])


def requested_bandwidths(manifest: Manifest) -> list[str] | None:
    """The rates a run asks for: None (no shaping), one rate, or the list to loop over.

    ``network.bandwidth`` set by an override wins over a ``network.bandwidths``
    list in the file (one run at that rate), unless the list was overridden too.
    """
    net = dict(manifest.network or {})
    single, many = net.get("bandwidth"), net.get("bandwidths")
    overrides = manifest.parsed_overrides
    if single not in (None, "") and _set_by(overrides, "network.bandwidth") \
            and not _set_by(overrides, "network.bandwidths"):  # fmt: skip
        return [str(single)]
    if many:
        return [str(b) for b in many]
    if single not in (None, ""):
        return [str(single)]
    return None


def plan_runs(manifest: Manifest) -> RunPlan:
    """The runs ``manifest`` (with the overrides it was loaded with) asks for."""
    bandwidths = requested_bandwidths(manifest)
    delay = (manifest.network or {}).get("delay_ms")
    link = requirement.link_args(manifest.network)
    if bandwidths is None and not (delay or link):
        return RunPlan(PLAIN, manifest, (PlannedRun(manifest),))
    if bandwidths is None or len(bandwidths) == 1:
        bandwidth = bandwidths[0] if bandwidths else None
        return RunPlan(SHAPED, manifest, (PlannedRun(manifest, bandwidth, delay, link=link),))
    runs = tuple(
        PlannedRun(
            derive_manifest(manifest, [
                Override.parse(f"network.bandwidth={bw}"),
                Override.parse("network.bandwidths=null"),
            ]),
            bw,
            delay,
            subdir=bandwidth_dir_name(bw),
            link=link,
        )  # fmt: skip
        for bw in bandwidths
    )
    return RunPlan(SWEEP, manifest, runs)


def bandwidth_dir_name(bandwidth: str) -> str:
    """A directory name for a rate: ``4MB/s`` -> ``bw-4MBps``, ``100Mbit`` -> ``bw-100Mbit``."""
    text = str(bandwidth).strip().replace("/s", "ps").replace("/", "p")
    return "bw-" + re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def _set_by(overrides: tuple[Override, ...], key: str) -> bool:
    return any(o.sets(key) for o in overrides)


# ----- resuming an incomplete run ---------------------------------------------------------------
#: what a resumed run must share with the run it continues (else its rows would not belong)
SAME_AS_RESUMED = ("model", "dataset", "participant_instances", "transport")


def resume_counts(rows: list[dict]) -> dict[int, int]:
    """``{split: successful measurements}`` in a run's inference rows (failed ones are redone)."""
    counts: dict[int, int] = {}
    for r in rows:
        if r.get("error") or r.get("split") in (None, ""):
            continue
        try:
            k = int(r["split"])
        except ValueError:
            continue
        counts[k] = counts.get(k, 0) + 1
    return counts


def plan_resume(manifest: Manifest, source: Path) -> RunPlan:
    """The plan that continues the incomplete run in ``source`` with ``manifest``.

    The split points ``source`` measured are not measured again: their counts (from its
    ``inferences.csv``) reach the edge's partitioner as ``partitioner.params.done``, and the
    infer-dataset task runs only what is left, so every split ends with its planned count.
    The resumed run writes a new directory holding ``source``'s rows and the new ones.
    """
    source = Path(source)
    plan = plan_runs(manifest)
    if plan.kind == SWEEP:
        raise TracrError(
            "--resume continues one run, not a bandwidth sweep.",
            hint="resume one rate's run: --resume GROUP/bw-RATE --set network.bandwidth=RATE "
                 "--set network.bandwidths=null",
        )
    check_same_experiment(manifest, source)
    rows = complete_rows(source / "inferences.csv")
    instances = {r.get("instance") for r in rows if r.get("instance")}
    if len(instances) > 1:
        raise TracrError(f"--resume: {source} has rows from {len(instances)} measuring "
                         "participants; only runs with one can be resumed.")
    resumed = resume_manifest(manifest, resume_counts(rows), source)
    run = dataclasses.replace(plan.runs[0], manifest=resumed, resume_from=source)
    return RunPlan(plan.kind, resumed, (run,))


def resume_manifest(manifest: Manifest, done: dict[int, int], source: Path) -> Manifest:
    """``manifest`` told what is done: the partitioner skips it and the task runs the rest.

    The overrides recorded stay the user's own (a resumed run can itself be resumed).
    """
    data = manifest.raw
    steps = [step for tasks in data["playbook"].values() for step in tasks
             if step["task"] == "infer-dataset"]
    if len(steps) != 1:
        raise TracrError(f"--resume needs exactly one infer-dataset task in the playbook "
                         f"(found {len(steps)}).")
    params, part = steps[0]["params"], data["partitioner"]
    total_done = sum(done.values())
    summary = _summary(source)
    if summary and summary.get("status") == "ok" and not summary.get("incomplete"):
        raise TracrError(f"{source} is a complete run; there is nothing to resume.",
                         hint="run the experiment again without --resume")
    if params.get("count") is not None:
        left = int(params["count"]) - total_done
        if left <= 0:
            raise TracrError(f"{source} already has the {params['count']} measurements planned; "
                             "there is nothing to resume.")
        params["count"] = left
    elif part["name"] != "cyclic":
        raise TracrError(
            f"--resume with the {part['name']} partitioner needs the number of inferences "
            "planned: the infer-dataset task's params.count.",
            hint="give it the count the run was started with: "
                 "--set +playbook.INSTANCE.0.params.count=N",
        )
    if part["name"] == "cyclic":
        pparams = part["params"]
        if params.get("count") is None:
            sweeps = params.get("sweeps", (data.get("run") or {}).get("repeats") or 1)
            pparams["passes"] = int(sweeps) * int(pparams.get("passes", 1))
            params["sweeps"] = 1
        pparams["done"] = {int(k): int(n) for k, n in sorted(done.items())}
    return validate_data(data, name=manifest.name, path=manifest.path,
                         overrides=manifest.parsed_overrides)


def check_same_experiment(manifest: Manifest, source: Path) -> None:
    """Refuse (exit 2) to resume a run of another model, dataset or set of participants."""
    path = Path(source) / "manifest.yaml"
    if not path.is_file():
        raise TracrError(f"{source} has no manifest.yaml: not a tracr run directory.",
                         hint="point --resume at a run directory, its id, or last")
    before, _ = load_yaml_file(path)
    now = manifest.raw
    for key in SAME_AS_RESUMED:
        if not isinstance(before, dict) or before.get(key) != now.get(key):
            raise TracrError(
                f"--resume: {source} ran with a different {key} than {manifest.name} now has.",
                hint="resume with the manifest and --set overrides of that run "
                     f"(see {path})",
            )
    if (before.get("partitioner") or {}).get("name") != manifest.partitioner.get("name"):
        raise TracrError(f"--resume: {source} used another partitioner.",
                         hint=f"see {path}")


def _summary(source: Path) -> dict | None:
    try:
        data = json.loads((Path(source) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def recorded_overrides(source: Path) -> list[str]:
    """The ``--set`` overrides the run in ``source`` was started with (``overrides.json``)."""
    try:
        data = json.loads((Path(source) / "overrides.json").read_text())
    except (OSError, ValueError):
        return []
    return [str(o) for o in data] if isinstance(data, list) else []
