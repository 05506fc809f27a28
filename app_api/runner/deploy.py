"""Deploy phase: start every participant, say hello, set each one up."""

from __future__ import annotations

import ipaddress
import os
import time

from app_api.launch import ParticipantSpec, launcher_for
from app_api.runner.compat import check_environments
from app_api.runner.llm import llm_setup
from app_api.runner.state import RunState, parallel
from experiment_design.protocol import SetupConfig
from experiment_design.roles import get_role


def participant_specs(state: RunState) -> list[ParticipantSpec]:
    """One spec per participant instance; unknown roles fail before any process starts."""
    m = state.manifest
    specs = []
    for inst in m.participant_instances:
        ptype = m.participant_types[inst["type"]]
        settings = ptype.get("settings") or {}
        get_role(ptype["role"])
        threads = settings.get("threads")
        if threads is None and inst["device"] == "localhost":
            threads = 1
        specs.append(ParticipantSpec(inst["name"], ptype["role"], inst["device"], threads,
                                     os.urandom(32), liveness_s=state.liveness_s,
                                     startup_s=state.startup_s))
        state.roles[inst["name"]] = ptype["role"]
    return specs


def deploy(state: RunState) -> list[ParticipantSpec]:
    """Start the participants in parallel, record their environments, set them up."""
    specs = participant_specs(state)
    state.view.phase(f"deploying {len(specs)} participants: "
                     + ", ".join(f"{s.instance} ({s.role} on {s.device})" for s in specs))

    def start(spec: ParticipantSpec) -> None:
        # adopted as soon as its process exists: beaten by the pulse, stopped by teardown
        launcher_for(spec.device).start(spec, adopt=lambda h: state.adopt(spec.instance, h))

    t0 = time.perf_counter()
    parallel(start, specs, check=state.check_run)
    state.times["start_s"] = time.perf_counter() - t0
    for s in specs:
        env = state.client(s.instance).hello().to_dict()
        env.update(device_name=s.device, host_label=state.handles[s.instance].host_label)
        state.envs[s.instance] = env
    state.extra["warnings"] = check_environments(state.envs)

    def setup(spec: ParticipantSpec) -> None:
        # no data secret: each participant gets its own links' keys when it is wired
        state.infos[spec.instance] = state.client(spec.instance).setup(
            participant_config(state, spec, ""))

    t0 = time.perf_counter()
    parallel(setup, specs, check=state.check)
    state.times["setup_s"] = time.perf_counter() - t0
    for inst, info in state.infos.items():  # which cuts each side built before measuring
        state.envs[inst]["prepared"] = info.prepared
    return specs


def participant_config(state: RunState, spec: ParticipantSpec, data_secret: str) -> SetupConfig:
    """The set-up of one participant, from the manifest."""
    m = state.manifest
    inst = next(i for i in m.participant_instances if i["name"] == spec.instance)
    ptype = m.participant_types[inst["type"]]
    settings = dict(ptype.get("settings") or {})
    model = dict(m.model)
    override = ptype.get("model")
    if isinstance(override, str):
        model["name"] = override
    elif isinstance(override, dict):
        model.update(override)
    return SetupConfig(
        instance=spec.instance,
        model=model,
        seed=int((m.run or {}).get("seed", 0) or 0),
        dataset=m.dataset,
        transport=m.transport,
        partitioner=m.partitioner,
        run=dict(m.run or {}),
        data_secret=data_secret,
        threads=spec.threads,
        data_bind=settings.get("data_bind") or default_bind(state, spec),
        settings=settings,
        pipeline=m.pipeline,
        extra=llm_setup(m, spec.instance),
    )


def default_bind(state: RunState, spec: ParticipantSpec) -> str:
    """Loopback on localhost; on a device, the address its partners use (if an IP)."""
    if spec.device == "localhost":
        return "127.0.0.1"
    host = getattr(state.handles.get(spec.instance), "data_host", None) or ""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return "0.0.0.0"  # a host name: listen everywhere; the data path is authenticated
