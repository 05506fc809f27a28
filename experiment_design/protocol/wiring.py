"""data_address(), admit_partners() and connect_partners(): who connects to whom."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from experiment_design.protocol.wire import Message, ProtocolError


@dataclass
class DataAddress(Message):
    """data_address()'s reply: where partners reach this participant's data server."""

    host: str
    port: int


@dataclass
class PartnerAddress(Message):
    """One partner a participant connects to."""

    omit_none: ClassVar[bool] = True

    instance: str
    host: str
    port: int
    #: the link's key (hex, ``transport.auth.link_key``): the observer derives it from the
    #: run's secret, which participants never see; absent: derived from the participant's
    #: own ``data_secret`` (scripts and tests that drive roles by hand)
    key: str | None = None


@dataclass
class Wiring(Message):
    """connect_partners(): partners by slot, written flat as ``{slot: [address, ...]}``."""

    partners: dict[str, list[PartnerAddress]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{slot: [{"instance", "host", "port"}, ...]}``."""
        return {slot: [p.to_dict() for p in peers] for slot, peers in self.partners.items()}

    @classmethod
    def from_dict(cls, data: Any) -> Wiring:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, dict):
            raise ProtocolError(f"Wiring: expected a JSON object, got {data!r}")
        return cls({slot: [PartnerAddress.from_dict(p) for p in peers]
                    for slot, peers in data.items()})


@dataclass
class AdmittedPartner(Message):
    """A participant that will connect to this one's data server: its name, the
    addresses it connects from (IPs or host names) and the link's key (hex)."""

    instance: str
    hosts: list[str] = field(default_factory=list)
    key: str = ""


@dataclass
class Admission(Message):
    """admit_partners(): everyone that will connect to this participant's data server.
    Only they are let in, each once, and the server stops listening when all have."""

    partners: list[AdmittedPartner] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """``{"partners": [{"instance", "hosts", "key"}, ...]}``."""
        return {"partners": [p.to_dict() for p in self.partners]}

    @classmethod
    def from_dict(cls, data: Any) -> Admission:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, dict) or not isinstance(data.get("partners", []), list):
            raise ProtocolError(f"Admission: expected {{'partners': [...]}}, got {data!r}")
        return cls([AdmittedPartner.from_dict(p) for p in data.get("partners", [])])
