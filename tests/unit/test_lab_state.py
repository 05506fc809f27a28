"""The lab's state file and the checks that run before anything is created."""

from __future__ import annotations

import json

import pytest

import app
from app_api.lab import cgroup, network, state, system
from app_api.lab.lifecycle import parse_quotas
from experiment_design.errors import TracrError, UnknownNameError


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(tmp_path))
    # the lab's root-owned directory, here inside the test's own
    monkeypatch.setattr(state, "LAB_ROOT", tmp_path / "lab", raising=False)
    return tmp_path


def test_state_round_trip(cfg):
    assert state.load_state() is None
    s = state.new_state()
    h = state.host_entry(s, "lab-1")
    h.update(ns="tracr-lab-1", sshd_pid=123)
    assert state.host_entry(s, "lab-1") is h
    path = state.save_state(s)
    assert path == cfg / "lab" / "state.json"
    assert [p.name for p in path.parent.iterdir() if p.is_file()] == ["state.json"]
    loaded = state.load_state()
    assert loaded["hosts"] == [{"name": "lab-1", "ns": "tracr-lab-1", "sshd_pid": 123}]
    assert state.remove_state() is True
    assert state.remove_state() is False
    assert state.load_state() is None


def test_old_state_gains_new_keys(cfg):
    (cfg / "lab").mkdir()
    (cfg / "lab" / "state.json").write_text(json.dumps({"version": 1, "hosts": []}))
    loaded = state.load_state()
    assert loaded["registry"] == [] and loaded["measured"] == {}


@pytest.mark.parametrize("text", ["{not json", json.dumps({"version": 99}), "[]"])
def test_unreadable_state_is_a_user_error(cfg, text):
    (cfg / "lab").mkdir()
    (cfg / "lab" / "state.json").write_text(text)
    with pytest.raises(TracrError) as err:
        state.load_state()
    assert "tracr lab down" in err.value.hint


def test_non_root_is_refused_with_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(system.os, "geteuid", lambda: 1000)
    with pytest.raises(TracrError) as err:
        system.require_root()
    assert "root" in err.value.message and err.value.exit_code == 2
    for argv in (
        ["lab", "up", "--hosts", "2"],
        ["lab", "down"],
        ["lab", "shape", "--bandwidth", "4MB/s"],
    ):
        assert app.main(argv) == 2
        assert "needs root" in capsys.readouterr().err


def test_non_linux_is_refused(monkeypatch):
    monkeypatch.setattr(system.sys, "platform", "darwin")
    with pytest.raises(TracrError, match="Linux"):
        system.require_root()


def test_parse_quotas():
    assert parse_quotas(["lab-1=0.25", "lab-2=1.5"], 2) == {"lab-1": 0.25, "lab-2": 1.5}
    assert parse_quotas({"lab-1": 0.5}, 1) == {"lab-1": 0.5}
    assert parse_quotas(None, 2) == {}
    with pytest.raises(UnknownNameError):
        parse_quotas(["lab-3=0.5"], 2)
    for bad in (["lab-1"], ["lab-1=fast"], ["lab-1=0"], ["lab-1=-1"]):
        with pytest.raises(TracrError):
            parse_quotas(bad, 2)


def test_quota_us():
    assert cgroup.quota_us(0.25, 100_000) == 25_000
    assert cgroup.quota_us(1.5, 100_000) == 150_000
    assert cgroup.quota_us(0.01, 100_000) == 1000  # the kernel's minimum, exactly
    # the default period is short (10 ms), so a quota'd host is evenly slower
    assert cgroup.PERIOD_US == 10_000
    assert cgroup.quota_us(0.25) == 2_500
    assert cgroup.quota_us(1.5) == 15_000


def test_a_quota_is_never_rounded_up_to_the_kernels_minimum():
    # Regression: 0.6 core at a 1 ms period was written as a 1 ms quota per 1 ms, a whole
    # core, and the lab reported the host as a 0.6-core one.
    with pytest.raises(TracrError, match="below the kernel's 1 ms minimum") as err:
        cgroup.quota_us(0.6, 1_000)
    assert "1.667 ms" in err.value.hint  # the shortest period at which 0.6 core fits
    with pytest.raises(TracrError):
        cgroup.quota_us(0.05)  # 0.5 ms per 10 ms
    assert cgroup.shortest_period_us(0.6) == 1_667
    assert cgroup.quota_us(0.6, cgroup.shortest_period_us(0.6)) == 1_000
    # no period asked for: the default, lengthened where a fraction needs it
    assert cgroup.host_period_us(0.6) == cgroup.PERIOD_US
    assert cgroup.host_period_us(0.05) == 20_000
    assert cgroup.quota_us(0.05, cgroup.host_period_us(0.05)) == 1_000
    assert cgroup.host_period_us(0.6, 1_000) == 1_000  # asked for: kept (and refused above)


def test_parse_quotas_checks_each_quota_against_the_period_asked_for():
    assert parse_quotas(["lab-1=0.05"], 2) == {"lab-1": 0.05}  # default period lengthened
    with pytest.raises(TracrError, match="kernel"):
        parse_quotas(["lab-1=0.6"], 2, period=1_000)
    assert parse_quotas(["lab-1=0.6"], 2, period=2_000) == {"lab-1": 0.6}


def test_period_us():
    assert cgroup.period_us(None) == cgroup.PERIOD_US
    assert cgroup.period_us(10) == 10_000
    assert cgroup.period_us(2.5) == 2_500
    assert cgroup.period_us("100") == 100_000
    for bad in (0, 0.5, 1001, "fast"):
        with pytest.raises(TracrError):
            cgroup.period_us(bad)


def test_create_writes_period(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory")
    path = cgroup.create("tracr-lab-1", 0.25, 20_000)
    assert (path / "cpu.max").read_text() == "5000 20000"
    assert cgroup.read_period_us(path) == 20_000
    assert cgroup.read_quota(path) == 0.25
    path = cgroup.create("tracr-lab-2", 0.25)
    assert (path / "cpu.max").read_text() == "2500 10000"
    # a host outweighs any other work on the machine, up to its quota
    assert (path / "cpu.weight").read_text() == "10000"


def test_delay_without_netem_goes_to_the_link_emulator(monkeypatch):
    from app_api.lab import links

    monkeypatch.setitem(network._QDISC_CACHE, "netem", False)
    spec = links.link_spec(["lab-1"], links.direction_config(bandwidth="4MB/s", delay="10"))
    assert links.choose_mechanism(spec) == "user"
    plain = links.link_spec(["lab-1"], links.direction_config(bandwidth="4MB/s"))
    assert links.choose_mechanism(plain) == "tbf"
    assert links.choose_mechanism(links.link_spec(["lab-1"], links.direction_config())) is None


def test_netem_plan_when_available(monkeypatch):
    from app_api.lab import links

    monkeypatch.setitem(network._QDISC_CACHE, "netem", True)
    spec = links.link_spec(["lab-1"], links.direction_config(bandwidth="4MB/s", delay="10"))
    assert links.choose_mechanism(spec) == "netem"
    assert links.netem_args(spec["lab-1"]["up"])[:5] == ["netem", "delay", "10ms", "rate",
                                                         "32000000bit"]


def test_host_names():
    assert network.host_names(3) == {
        "name": "lab-3",
        "ns": "tracr-lab-3",
        "address": "10.213.0.4",
        "veth_host": "trlab-3h",
        "veth_ns": "trlab-3n",
        "veth_emu": "trlab-3x",
        "veth_bridge": "trlab-3y",
    }


def test_link_report_and_edge_profile_carry_the_period(cfg):
    from app_api.lab import link_report
    from app_api.runner.labfacts import lab_quota as _lab_quota
    from app_api.runner.warmup import with_quota as _with_quota

    st = state.new_state()
    h = state.host_entry(st, "lab-1")
    h.update(ns="tracr-lab-1", cpu_quota=0.25, cpu_measured=0.247, cpu_period_us=20_000)
    state.host_entry(st, "lab-2").update(ns="tracr-lab-2")
    state.save_state(st)
    cpu = link_report()["cpu"]
    assert cpu == {"lab-1": {"quota": 0.25, "measured": 0.247, "period_us": 20_000,
                             "mode": "quota"}}
    prof = _with_quota({"layers": {}}, _lab_quota("lab-1"))
    assert prof["cpu_quota"] == {"quota_ms": 5.0, "period_ms": 20.0, "fraction": 0.25,
                                 "source": "lab", "measured": 0.247, "mode": "quota"}
    assert "cpu_quota" not in _with_quota({"layers": {}}, _lab_quota("lab-2"))
    # the share every limited host got while all were busy travels with it
    h["cpu_measured_together"] = 0.54
    state.save_state(st)
    assert link_report()["cpu"]["lab-1"]["measured_together"] == 0.54
    assert _with_quota({"layers": {}}, _lab_quota("lab-1"))["cpu_quota"][
        "measured_together"] == 0.54
    del h["cpu_measured_together"]
    state.save_state(st)
    # a participant that read its own quota keeps it
    own = {"quota_ms": 50.0, "period_ms": 100.0, "fraction": 0.5}
    assert _with_quota({"cpu_quota": own}, _lab_quota("lab-1"))["cpu_quota"] == own
    # a lab brought up before the period was recorded ran with the old 100 ms period
    del st["hosts"][0]["cpu_period_us"]
    state.save_state(st)
    assert link_report()["cpu"]["lab-1"]["period_us"] == 100_000
    assert _lab_quota("lab-1")["period_ms"] == 100.0


def test_save_state_follows_no_planted_link(cfg, tmp_path):
    """Links planted where the state (or its temp file) is written are never followed."""
    d = state.state_path().parent
    d.mkdir(parents=True, exist_ok=True)
    victim = tmp_path / "victim"
    victim.write_text("root's file")
    for name in ("state.json", "state.json.tmp"):
        (d / name).symlink_to(victim)
    state.save_state(state.new_state())
    assert victim.read_text() == "root's file"
    assert not state.state_path().is_symlink()
    assert state.load_state()["hosts"] == []


def test_load_state_refuses_a_link(cfg, tmp_path):
    d = state.state_path().parent
    d.mkdir(parents=True, exist_ok=True)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(state.new_state()))
    state.state_path().symlink_to(elsewhere)
    with pytest.raises(TracrError, match="symbolic link"):
        state.load_state()


@pytest.mark.parametrize(
    "field, value",
    [
        ("ns", "../../etc"),
        ("veth_host", "eth0"),
        ("cgroup", "/sys/fs/cgroup/system.slice"),
        ("dir", "/etc"),
        ("sshd_config", "/tmp/evil/sshd_config"),
        ("name", "lab-1; rm -rf /"),
        ("sshd_pid", True),
    ],
)
def test_validate_state_names_every_foreign_field(cfg, field, value):
    from app_api.devices.registry import known_hosts_path

    good = state.new_state()
    h = state.host_entry(good, "lab-2")
    h.update({k: v for k, v in state.expected_host("lab-2").items() if k != "cgroups"})
    h.update(cgroup=str(cgroup.CGROUP_ROOT / "tracr-lab-2"), sshd_pid=4321)
    good.update(registry=["lab-2"], known_hosts=str(known_hosts_path()),
                known_hosts_lines=["10.213.0.3 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA"])
    assert state.validate_state(good, known_hosts_path()) == []
    h[field] = value
    problems = state.validate_state(good, known_hosts_path())
    assert problems and repr(value) in problems[0]


def test_validate_state_refuses_foreign_paths_and_names(cfg, tmp_path):
    from app_api.devices.registry import known_hosts_path

    forged = state.new_state()
    forged.update(known_hosts=str(tmp_path / "hosts"), client_key="/etc/shadow",
                  registry=["pi4"], known_hosts_lines=["example.com ssh-rsa AAAA"])
    problems = " ".join(state.validate_state(forged, known_hosts_path()))
    for bad in ("hosts", "/etc/shadow", "pi4", "example.com"):
        assert bad in problems
