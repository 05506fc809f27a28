"""Energy collectors: joules per inference per participant, each figure naming its method.

A collector reads one source of energy on the device it runs on and is registered by
name (``@register_energy("rapl")``); users add their own the same way. Each one first
:meth:`~EnergyCollector.probe`\\ s its source and answers supported or a reason, so a
device without a counter reports ``unsupported: <why>``, never a blank or a guess; the
model-based ``estimate`` is a collector of its own, always labelled ``estimated``, and
never stands in for a measured one. The participant's sampler reads every supported
collector off the timed path; :func:`integrate` turns the samples of a window into
joules with an interval (see :mod:`experiment_design.energy.window`).

Built in: ``rapl`` (Intel/AMD through powercap sysfs), ``nvml`` (NVIDIA GPUs),
``jetson`` (the INA3221 input rail), ``external`` (a command that prints watts),
``estimate`` (idle + dynamic x CPU share, coefficients and their source stated).
"""

from experiment_design.energy.base import (
    DEFAULT_COLLECTORS,
    ENERGY,
    EnergyCollector,
    Probe,
    create_energy,
    list_energy,
    register_energy,
)
from experiment_design.energy.window import EnergyFigure, integrate

__all__ = ["DEFAULT_COLLECTORS", "ENERGY", "EnergyCollector", "EnergyFigure", "Probe",
           "create_energy", "integrate", "list_energy", "register_energy"]
