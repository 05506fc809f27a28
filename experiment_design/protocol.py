"""The control protocol between the observer and its participants, torch-free.

Both sides import this module; nothing about the protocol is written anywhere
else. A participant process announces itself with one line on stdout::

    TRACR-READY {"port": 40123, "pid": 4242}

and is then driven over rpyc (only ``exposed_`` members, no pickle).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: ``python -m <PARTICIPANT_MODULE> --role NAME ...`` starts a participant process.
PARTICIPANT_MODULE = "experiment_design.runtime.participant"
READY_PREFIX = "TRACR-READY "


@dataclass(frozen=True)
class Ready:
    """What a participant process announces once its control server listens."""

    port: int
    pid: int

    def line(self) -> str:
        """The stdout line, without its newline."""
        return READY_PREFIX + json.dumps({"port": self.port, "pid": self.pid})

    @classmethod
    def parse(cls, line: str) -> Ready | None:
        """The announcement in ``line``, or None when the line is something else."""
        line = line.strip()
        if not line.startswith(READY_PREFIX):
            return None
        data = json.loads(line[len(READY_PREFIX):])
        return cls(port=int(data["port"]), pid=int(data["pid"]))
