"""Energy collectors against fake sysfs trees (CI machines have no power counters), the
window integrator, and what this machine's real sources report."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiment_design.energy import (
    EnergyCollector,
    Probe,
    create_energy,
    integrate,
    list_energy,
    register_energy,
)
from experiment_design.energy.base import ENERGY
from experiment_design.energy.window import MIN_SAMPLES


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _rapl_zone(root: Path, name: str, uj: int, max_uj: int, label: str = "package-0") -> Path:
    z = root / "sys/class/powercap" / name
    _write(z / "energy_uj", f"{uj}\n")
    _write(z / "max_energy_range_uj", f"{max_uj}\n")
    _write(z / "name", label + "\n")
    return z


# ----- RAPL ------------------------------------------------------------------------------------
def test_rapl_sums_packages_and_unwinds_a_counter_wrap(tmp_path):
    z0 = _rapl_zone(tmp_path, "intel-rapl:0", 999_000_000, 1_000_000_000)
    z1 = _rapl_zone(tmp_path, "intel-rapl:1", 5_000_000, 1_000_000_000, "package-1")
    _rapl_zone(tmp_path, "intel-rapl:0:0", 7, 1_000_000_000, "core")  # inside package 0
    c = create_energy("rapl", tmp_path)
    p = c.probe()
    assert p.supported, p.reason
    assert [z.name for z in c.zones] == ["intel-rapl:0", "intel-rapl:1"]
    assert c.read() == 0.0
    # package 0 passes its range (999 J -> wraps -> 2 J: 3 J + 1 uJ), package 1 gains 1 J
    _write(z0 / "energy_uj", "2000000\n")
    _write(z1 / "energy_uj", "6000000\n")
    assert c.read() == pytest.approx(3.0 + 1e-6 + 1.0)
    _write(z0 / "energy_uj", "4000000\n")
    assert c.read() == pytest.approx(6.0 + 1e-6)
    assert c.info()["label"] == "measured"


def test_rapl_without_a_tree_or_zone_is_unsupported_with_a_reason(tmp_path):
    p = create_energy("rapl", tmp_path).probe()
    assert not p.supported and "powercap" in p.reason
    (tmp_path / "sys/class/powercap/dtpm").mkdir(parents=True)
    p = create_energy("rapl", tmp_path).probe()
    assert not p.supported and "no RAPL package zone" in p.reason


def test_rapl_unreadable_counter_says_so(tmp_path):
    z = _rapl_zone(tmp_path, "intel-rapl:0", 1, 10)
    (z / "energy_uj").unlink()
    (z / "energy_uj").mkdir()  # reading a directory fails like an unreadable file does
    p = create_energy("rapl", tmp_path).probe()
    assert not p.supported and "intel-rapl:0" in p.reason


# ----- Jetson ----------------------------------------------------------------------------------
def test_jetson_reads_the_input_rail_of_the_old_driver(tmp_path):
    dev = tmp_path / "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0"
    for c, (name, mw) in enumerate([("POM_5V_IN", 5123), ("POM_5V_GPU", 900),
                                    ("POM_5V_CPU", 1500)]):
        _write(dev / f"rail_name_{c}", name + "\n")
        _write(dev / f"in_power{c}_input", f"{mw}\n")
    c = create_energy("jetson", tmp_path)
    p = c.probe()
    assert p.supported and p.detail["rail"] == "POM_5V_IN"
    assert c.kind == "power" and c.read() == pytest.approx(5.123)
    _write(dev / "in_power0_input", "7000\n")
    assert c.read() == pytest.approx(7.0)


def test_jetson_reads_the_input_rail_of_the_hwmon_driver(tmp_path):
    hw = tmp_path / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
    for c, (name, mv, ma) in enumerate([("VDD_IN", 5000, 1200), ("VDD_CPU_GPU_CV", 5000, 300)],
                                       start=1):
        _write(hw / f"in{c}_label", name + "\n")
        _write(hw / f"in{c}_input", f"{mv}\n")
        _write(hw / f"curr{c}_input", f"{ma}\n")
    c = create_energy("jetson", tmp_path)
    assert c.probe().supported
    assert c.read() == pytest.approx(6.0)  # 5 V x 1.2 A


def test_jetson_refuses_to_sum_rails_without_an_input_rail(tmp_path):
    hw = tmp_path / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
    _write(hw / "in1_label", "VDD_CPU\n")
    _write(hw / "in1_input", "5000\n")
    _write(hw / "curr1_input", "100\n")
    p = create_energy("jetson", tmp_path).probe()
    assert not p.supported and "input rail" in p.reason and "VDD_CPU" in p.reason
    assert "not a Jetson" in create_energy("jetson", tmp_path / "none").probe().reason


# ----- NVML: through its function boundary (this machine has no GPU) ---------------------------
class FakeNvml:
    """The few pynvml functions the collector calls, over a settable counter."""

    def __init__(self, energy_mj: int | None = 1000, power_mw: int = 70_000,
                 fail_init: bool = False) -> None:
        self.energy_mj, self.power_mw, self.fail_init = energy_mj, power_mw, fail_init
        self.shut = 0

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shut += 1

    def nvmlDeviceGetHandleByIndex(self, i):
        if i != 0:
            raise RuntimeError("Invalid Argument")
        return "gpu0"

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA Fake"

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if self.energy_mj is None:
            raise RuntimeError("Not Supported")
        return self.energy_mj

    def nvmlDeviceGetPowerUsage(self, h):
        return self.power_mw


def test_nvml_reads_the_energy_counter_where_the_gpu_keeps_one():
    lib = FakeNvml(energy_mj=1000)
    c = create_energy("nvml", library=lib)
    p = c.probe()
    assert p.supported and c.kind == "counter" and p.detail["gpu"] == "NVIDIA Fake"
    lib.energy_mj = 3500
    assert c.read() == pytest.approx(2.5)
    assert "1 s" in c.info()["sampling_gaps"]
    c.close()
    assert lib.shut == 1


def test_nvml_falls_back_to_power_on_an_older_gpu_and_says_so():
    c = create_energy("nvml", library=FakeNvml(energy_mj=None, power_mw=42_500))
    assert c.probe().supported and c.kind == "power"
    assert c.read() == pytest.approx(42.5)


def test_nvml_that_does_not_start_or_has_no_such_gpu_is_unsupported():
    p = create_energy("nvml", library=FakeNvml(fail_init=True)).probe()
    assert not p.supported and "Not Found" in p.reason
    p = create_energy("nvml", index=3, library=FakeNvml()).probe()
    assert not p.supported and "GPU 3" in p.reason


# ----- external meter and the estimate --------------------------------------------------------
def test_external_meter_reads_the_first_number_its_command_prints(tmp_path):
    meter = tmp_path / "meter"
    _write(meter, "#!/bin/sh\necho 'power: 4.25 W'\n")
    meter.chmod(0o755)
    c = create_energy("external", command=str(meter))
    assert c.probe().supported and c.read() == pytest.approx(4.25)
    _write(meter, "#!/bin/sh\necho nothing\n")
    assert "no number" in create_energy("external", command=str(meter)).probe().reason
    assert not create_energy("external").probe().supported
    slow = create_energy("external", command="sleep 5", timeout_s=0.2).probe()
    assert not slow.supported and "timed out" in slow.reason


def test_the_estimate_is_labelled_estimated_with_its_coefficients_and_source():
    c = create_energy("estimate")
    assert c.probe().supported
    info = c.info()
    assert info["label"] == "estimated" and "Raspberry Pi 4" in info["source"]
    assert c.read(0.0) == pytest.approx(info["idle_w"])
    assert c.read(1.0) == pytest.approx(info["max_w"])
    assert c.read(0.5) == pytest.approx((info["idle_w"] + info["max_w"]) / 2)
    mine = create_energy("estimate", idle_w=1.0, max_w=3.0)
    assert mine.read(0.5) == pytest.approx(2.0) and "settings" in mine.info()["source"]
    assert not create_energy("estimate", idle_w=5, max_w=1).probe().supported


# ----- this machine ----------------------------------------------------------------------------
def test_on_this_machine_every_measured_source_reports_supported_or_a_reason():
    """No number is invented: a sensor absent here is unsupported, with why."""
    for name in ("rapl", "nvml", "jetson"):
        p = create_energy(name).probe()
        assert p.supported or p.reason, name


# ----- the registry ------------------------------------------------------------------------------
def test_users_register_their_own_collector():
    @register_energy("test-meter")
    class TestMeter(EnergyCollector):
        kind = "power"

        def probe(self) -> Probe:
            return Probe(True)

        def read(self, cpu_share: float = 0.0) -> float:
            return 1.5

    try:
        assert "test-meter" in list_energy()
        c = create_energy("test-meter")
        assert c.probe().supported and c.read() == 1.5 and c.info()["method"] == "test-meter"
    finally:
        ENERGY.remove("test-meter")


def test_an_unknown_collector_lists_the_valid_ones():
    with pytest.raises(Exception, match="rapl"):
        create_energy("rapll")


# ----- the window ---------------------------------------------------------------------------------
def test_a_counter_window_is_interpolated_and_bracketed():
    ts = [i * 0.05 for i in range(41)]  # 2 s at 50 ms
    vs = [10.0 * t for t in ts]  # 10 W
    f = integrate(ts, vs, "counter", 0.525, 1.525, method="rapl")
    assert f.status == "ok" and f.samples == 20
    assert f.joules == pytest.approx(10.0)
    assert f.low <= f.joules <= f.high
    assert f.low == pytest.approx(9.5) and f.high == pytest.approx(10.5)
    d = f.per(4)
    assert d["j_per_inference"] == pytest.approx(2.5) and d["interval"][0] <= 2.5
    assert d["watts"] == pytest.approx(10.0) and d["joules"] == pytest.approx(10.0)
    assert "j_per_inference" not in f.per(0) and f.per(0)["joules"] == pytest.approx(10.0)


def test_a_power_window_integrates_by_trapezoid_with_rectangle_bounds():
    ts = [i * 0.05 for i in range(30)]
    vs = [5.0 if i % 2 else 3.0 for i in range(30)]
    f = integrate(ts, vs, "power", 0.0, ts[-1], method="jetson")
    assert f.status == "ok"
    assert f.joules == pytest.approx(4.0 * ts[-1])
    assert f.low == pytest.approx(3.0 * ts[-1]) and f.high == pytest.approx(5.0 * ts[-1])


def test_a_window_with_fewer_than_twenty_samples_has_no_number():
    ts = [i * 0.05 for i in range(MIN_SAMPLES - 1)]
    f = integrate(ts, [1.0] * len(ts), "power", 0.0, ts[-1], method="estimate",
                  label="estimated")
    assert f.status == "insufficient" and f.joules is None
    d = f.per(10)
    assert "j_per_inference" not in d and "needed" in d["reason"]


# ----- the manifest ----------------------------------------------------------------------------
def test_a_manifest_naming_an_unknown_collector_is_refused_before_any_device():
    from app_api.manifest import load_manifest
    from experiment_design.errors import TracrError

    with pytest.raises(TracrError, match="unknown energy collector 'rapll'.*rapl"):
        load_manifest("alexnet-sweep", ["+participant_types.edge.settings.energy=[rapll]"])
    with pytest.raises(TracrError, match="sampler_ms"):
        load_manifest("alexnet-sweep", ["+participant_types.edge.settings.sampler_ms=-1"])
    m = load_manifest("alexnet-sweep", [
        "+participant_types.edge.settings.energy={estimate: {idle_w: 1, max_w: 3}}",
        "+participant_types.edge.settings.sampler_ms=100"])
    assert m.participant_types["edge"]["settings"]["energy"] == {
        "estimate": {"idle_w": 1, "max_w": 3}}
