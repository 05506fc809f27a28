"""NVIDIA GPUs through NVML (``pynvml``, shipped as ``nvidia-ml-py``).

On Volta and later GPUs NVML keeps a total-energy counter in millijoules
(``nvmlDeviceGetTotalEnergyConsumption``): the collector reads it as a counter. Older
GPUs only report power (``nvmlDeviceGetPowerUsage``, milliwatts), which the collector
reads as watts. Either way NVML's figures are not continuous: the board's sensor is read
by the driver every 20-100 ms depending on the GPU, and on many boards (A100, H100) the
power figure is an average over the last second, so a window shorter than about a second
is smeared over its neighbours; :meth:`NvmlCollector.info` states this beside the figure.
The GPU's energy is the whole board's, shared by every process that uses it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiment_design.energy.base import EnergyCollector, Probe, register_energy

SAMPLING_GAPS = ("NVML updates the board's sensor every 20-100 ms depending on the GPU; "
                 "power is averaged over up to 1 s on many boards: windows shorter than "
                 "about 1 s are smeared")


def _load_nvml() -> Any:
    import pynvml

    return pynvml


@register_energy("nvml")
class NvmlCollector(EnergyCollector):
    """GPU ``index``'s energy (a counter where the GPU keeps one, else power in watts).

    ``library`` replaces the ``pynvml`` module (an object with the same functions), for
    tests on machines without a GPU.
    """

    kind = "counter"

    def __init__(self, root: Path | str | None = None, index: int = 0,
                 library: Any = None, **params: Any) -> None:
        super().__init__(root, **params)
        self.index = int(index)
        self.lib = library
        self.handle: Any = None
        self._start_mj = 0
        self.gpu = ""

    def probe(self) -> Probe:
        """Supported when NVML starts and GPU ``index`` reports energy or power."""
        lib = self.lib
        if lib is None:
            try:
                lib = _load_nvml()
            except ImportError:
                return Probe(False, "pynvml (nvidia-ml-py) is not installed")
        try:
            lib.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            return Probe(False, f"NVML did not start: {exc}")
        self.lib = lib
        try:
            self.handle = lib.nvmlDeviceGetHandleByIndex(self.index)
            name = lib.nvmlDeviceGetName(self.handle)
            self.gpu = name.decode() if isinstance(name, bytes) else str(name)
        except Exception as exc:
            self.close()
            return Probe(False, f"GPU {self.index}: {exc}")
        try:
            self._start_mj = int(lib.nvmlDeviceGetTotalEnergyConsumption(self.handle))
            self.kind = "counter"
        except Exception as energy_exc:  # a GPU older than Volta: power only
            try:
                lib.nvmlDeviceGetPowerUsage(self.handle)
            except Exception as exc:
                self.close()
                return Probe(False, f"GPU {self.index} ({self.gpu}) reports neither energy "
                                    f"({energy_exc}) nor power ({exc})")
            self.kind = "power"
        return Probe(True, detail={"gpu": self.gpu, "index": self.index, "kind": self.kind})

    def read(self, cpu_share: float = 0.0) -> float:
        """Joules since :meth:`probe` (counter), or watts now (power)."""
        if self.kind == "counter":
            return (int(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle))
                    - self._start_mj) / 1e3
        return int(self.lib.nvmlDeviceGetPowerUsage(self.handle)) / 1e3

    def info(self) -> dict:
        """Method, kind, the GPU, and NVML's sampling gaps."""
        return {**super().info(), "kind": self.kind, "gpu": self.gpu,
                "covers": "the whole GPU board, shared by every process on it",
                "sampling_gaps": SAMPLING_GAPS}

    def close(self) -> None:
        """Shut NVML down (once)."""
        if self.lib is not None and self.handle is not None:
            try:
                self.lib.nvmlShutdown()
            except Exception:  # shutting down a library that failed: nothing left to free
                pass
        self.handle = None
