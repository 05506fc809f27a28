"""The emulated lab: several SSH hosts with shaped links on one Linux machine (root only).

Each host is a network namespace joined to a bridge by a veth pair, runs its own sshd,
can get a CPU quota (cgroups), and is paired in the device registry as ``lab-<n>``::

    from app_api import lab
    lab.up(hosts=2, bandwidth="4MB/s", cpu_quota=["lab-1=0.25"])
    lab.link_report()["bandwidth_Bps"]     # measured through the shaped veths
    lab.shape(bandwidth="16MB/s")          # re-shape and re-measure (under the link lock)
    with lab.link_lock():                  # hold the link for a whole shaped run
        ...
    lab.down()                             # removes everything it created
"""

from __future__ import annotations

from app_api.lab.lifecycle import status, up
from app_api.lab.lock import LabBusyError, link_lock
from app_api.lab.network import tbf_params
from app_api.lab.shaping import link_report, shape
from app_api.lab.state import load_state, state_path
from app_api.lab.teardown import down
from app_api.units import format_rate, parse_rate

__all__ = [
    "up",
    "down",
    "shape",
    "status",
    "link_report",
    "link_lock",
    "LabBusyError",
    "parse_rate",
    "format_rate",
    "tbf_params",
    "load_state",
    "state_path",
]
