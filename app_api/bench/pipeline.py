"""`tracr bench pipeline`: a pipelined run against its bound and its baselines, in one run.

Runs a pipeline manifest (default ``mobilenet-pipeline``: three lab hosts, so bring the
lab up first, see that manifest's header; ``--local`` puts every participant on this
machine instead) and reports, from that one run's ``summary.json``:

- ``throughput_over_bound``: measured throughput over ``bound_per_s`` (1 / the slowest
  stage's compute + outgoing transfer, measured in the same run);
- ``pipelined_over_sequential``: throughput mode over the same stages one inference at a
  time (latency mode);
- ``pipelined_over_single``: throughput mode over the best participant running the whole
  model alone;
- ``predicted_over_measured``: the partitioner's predicted throughput over the measured.

Targets (the lab, 3 hosts at 0.6 core each): >= 0.9, >= 2.0, > 1.0.

The manifest package (PyYAML) and the runner (torch) are imported inside the functions
that use them, for start-up time: ``tracr --help`` imports this module to list the
benchmark's arguments.
"""

from __future__ import annotations

import argparse
import tempfile

TARGETS = {"throughput_over_bound": 0.9, "pipelined_over_sequential": 2.0,
           "pipelined_over_single": 1.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `tracr bench pipeline`."""
    parser.add_argument("--manifest", default="mobilenet-pipeline",
                        help="pipeline manifest to run (default mobilenet-pipeline)")
    parser.add_argument("--local", action="store_true",
                        help="every participant on this machine (no lab)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="manifest override (repeatable)")


def run(args: argparse.Namespace) -> dict:
    """One run of the manifest; its ratios and the figures they come from."""
    from app_api.manifest import load_manifest
    from app_api.runner.execute import execute
    from app_api.runner.plan import plan_runs

    overrides = list(args.overrides)
    if args.local:
        # the file's instances, read before validation: their lab devices need not exist
        overrides += [f"participant_instances.{name}.device=localhost"
                      for name in _instance_names(args.manifest)]
    manifest = load_manifest(args.manifest, overrides)
    out = tempfile.mkdtemp(prefix="tracr-bench-pipeline-")
    result = execute(plan_runs(manifest), out_dir=out, progress=False)
    s = result.summary
    pipe = s.get("pipeline") or {}
    ratios = pipe.get("ratios") or {}
    singles = {c["chain"][0]: c.get("throughput_per_s") for c in pipe.get("configs", [])
               if c.get("mode") == "single"}
    out_d = {
        **{k: ratios.get(k) for k in (*TARGETS, "predicted_over_measured")},
        "throughput_per_s": s.get("throughput_per_s"),
        "bound_per_s": s.get("bound_per_s"),
        "chosen": pipe.get("chosen"),
        "single_per_s": singles,
        "stages": [{k: st.get(k) for k in ("instance", "first", "last", "compute_ms",
                                            "transfer_ms", "utilization", "queue_mean")}
                   for st in s.get("stages") or []],
        "targets": TARGETS,
        "met": {k: (ratios.get(k) is not None and (ratios[k] > v if k == "pipelined_over_single"
                                                    else ratios[k] >= v))
                for k, v in TARGETS.items()},
        # the hosts' CPU quotas and CFS periods: the latency-mode baseline depends on both
        "lab_cpu": ((s.get("network") or {}).get("lab") or {}).get("cpu"),
        "run_dir": str(result.run_dir),
        "status": s.get("status"),
    }
    out_d["exit_code"] = 0 if result.ok else 1
    return out_d


def _instance_names(name_or_path: str) -> list[str]:
    """The participant instance names a manifest file declares (not validated)."""
    from app_api.manifest import find_manifest
    from app_api.manifest.yamlio import load_yaml_file

    data, _ = load_yaml_file(find_manifest(name_or_path))
    instances = (data or {}).get("participant_instances") or []
    return [i["name"] for i in instances if isinstance(i, dict) and i.get("name")]
