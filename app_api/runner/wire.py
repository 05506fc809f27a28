"""Wire phase: connect each participant to the partners its role declares, matched by role."""

from __future__ import annotations

import ipaddress
import socket

from app_api.runner.compat import check_graphs
from app_api.runner.state import RunState
from experiment_design.errors import TracrError
from experiment_design.protocol import Admission, AdmittedPartner, PartnerAddress, Wiring
from experiment_design.roles import get_role, role_is
from experiment_design.roles.stage import ChainMember
from experiment_design.transport.auth import link_key


def wire(state: RunState) -> None:
    """Hand every participant the data addresses of its partners: along the manifest's
    ``pipeline.chain`` when it has one, else by role (never by instance name)."""
    chain = list((state.manifest.pipeline or {}).get("chain") or [])
    admit(state, links(state, chain))
    if chain:
        wire_chain(state, chain)
    for inst, role in state.roles.items():
        if inst in chain:
            continue
        cls = get_role(role)
        wiring = Wiring()
        for slot, want in cls.partners.items():
            peers = [p for p, r in state.roles.items() if p != inst and role_is(get_role(r), want)]
            if not peers:
                raise TracrError(
                    f"{inst} (role {role}) needs a '{want}' partner for '{slot}', and the "
                    "manifest has none.",
                    hint=f"add a participant instance whose role is {want} (or a subclass)",
                )
            wiring.partners[slot] = [partner_address(state, inst, p) for p in peers]
            state.pairs.extend((inst, p) for p in peers)
            check_partners(state, [(inst, p) for p in peers])
        if wiring.partners:
            state.client(inst).connect_partners(wiring)


def check_partners(state: RunState, pairs: list[tuple[str, str]]) -> None:
    """Before a participant connects: each of its partners checks its graph against the
    connecting participant's (the plan)."""
    check_graphs(lambda inst, plan: state.client(inst).check_graph(plan),
                 state.infos, state.envs, pairs)  # fmt: skip


def partner_address(state: RunState, inst: str, peer: str) -> PartnerAddress:
    """Where ``inst`` reaches ``peer``'s data server: a wildcard or a loopback address on
    another device is replaced by the host the observer reached that device at."""
    addr = state.client(peer).data_address()
    if addr is None:
        raise TracrError(f"{peer} (role {state.roles[peer]}) has no data server")
    host = addr.host
    far = state.handles[peer].device != state.handles[inst].device
    if host in ("0.0.0.0", "::") or (far and host in ("127.0.0.1", "::1")):
        host = state.handles[peer].data_host or "127.0.0.1"
    return PartnerAddress(instance=peer, host=host, port=addr.port,
                          key=link_key(state.data_secret, peer, inst).hex())


def links(state: RunState, chain: list[str]) -> list[tuple[str, str]]:
    """Every data link of the run as (the participant that connects, the one it reaches):
    the same partners :func:`wire` and :func:`wire_chain` connect."""
    out = [(inst, p) for inst in chain for p in chain[1:] if p != inst]
    for inst, role in state.roles.items():
        if inst in chain:
            continue
        for want in get_role(role).partners.values():
            out.extend((inst, p) for p, r in state.roles.items()
                       if p != inst and role_is(get_role(r), want))
    return out


def admit(state: RunState, pairs: list[tuple[str, str]]) -> None:
    """Before anyone connects, tell every participant that will be reached who will
    connect to it: each partner's name, the addresses it connects from and the key of
    their link. Its data server lets in only them, and stops listening once all have
    connected (nothing else can reach the port during the run)."""
    expected: dict[str, list[str]] = {}
    for inst, peer in pairs:
        if inst not in expected.setdefault(peer, []):
            expected[peer].append(inst)
    for peer, insts in expected.items():
        state.client(peer).admit_partners(Admission([
            AdmittedPartner(inst, sources(state, inst, peer),
                            link_key(state.data_secret, peer, inst).hex())
            for inst in insts]))


def route_source(host: str) -> str:
    """The address this machine's connections to ``host`` come from (a datagram socket's
    connect picks the route; nothing is sent). A host name is left to the peer."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return host  # no look-up here: the peer resolves it, within its own bound
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return host


def sources(state: RunState, inst: str, peer: str) -> list[str]:
    """The addresses ``inst``'s connections to ``peer`` come from: its device's address as
    the observer reaches it (a host name is resolved on ``peer``), or loopback and the
    address it connects to when both are on one device."""
    mine, theirs = state.handles[inst], state.handles[peer]
    if mine.device == "localhost" and theirs.device != "localhost":
        # this machine: its route to the peer says the source (a lab bridge address, say)
        return [route_source(partner_address(state, inst, peer).host)]
    if mine.device != theirs.device:
        return [mine.data_host or "127.0.0.1"]
    addr = state.client(peer).data_address()
    near = {"127.0.0.1", "::1", mine.data_host or "127.0.0.1"}
    if addr is not None and addr.host not in ("0.0.0.0", "::"):
        near.add(addr.host)
    return sorted(near)


def wire_chain(state: RunState, chain: list[str]) -> None:
    """Every member of the chain gets a channel to every other member but the first (which
    holds the inputs and only sends): a route may then visit the members in any order
    (a placement may leave one out) without new connections inside a measurement."""
    for inst in chain:
        if not issubclass(get_role(state.roles[inst]), ChainMember):
            raise TracrError(f"{inst} (role {state.roles[inst]}) cannot be a stage of a chain",
                             hint="chain members are edge, stage or cloud roles "
                                  "(or their subclasses)")
    for inst in chain:
        peers = [p for p in chain[1:] if p != inst]
        if not peers:
            continue
        wiring = Wiring()
        wiring.partners["chain"] = [partner_address(state, inst, p) for p in peers]
        state.pairs.extend((inst, p) for p in peers)
        check_partners(state, [(inst, p) for p in peers])
        state.client(inst).connect_partners(wiring)
