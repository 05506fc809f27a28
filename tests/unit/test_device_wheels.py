"""The wheel cache: platform tags, which wheels a device gets, unpacking one, the import list."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from app_api.devices import wheels
from app_api.devices.wheels import DEVICE_DEPS, DevicePlatform
from app_api.launch.bundle import NEED_PREFIX, bootstrap_command, build_bundle, bundle_header
from experiment_design.errors import TracrError

REPO = Path(__file__).resolve().parents[2]
X86 = DevicePlatform(python="3.11.7", machine="x86_64", libc="glibc", libc_version="2.36")
PI = DevicePlatform(python="3.11.2", machine="aarch64", libc="glibc", libc_version="2.31")


def test_platform_tags_follow_the_device_libc_and_arch():
    plats = X86.platforms()
    assert plats[0] == "manylinux_2_36_x86_64" and plats[-1] == "linux_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(plats)
    assert X86.key == "cp311-manylinux_2_36_x86_64"
    pi = PI.platforms()
    assert "manylinux_2_17_aarch64" in pi and "manylinux2014_aarch64" in pi
    assert not any("2_16" in p or "manylinux1" in p for p in pi)  # aarch64 starts at 2.17
    # a 32-bit userland on a 64-bit Raspberry Pi kernel loads armv7l wheels
    assert DevicePlatform(python="3.11.2", machine="aarch64", bits=32, libc_version="2.31").arch \
        == "armv7l"
    assert "cp311-abi3-manylinux_2_28_aarch64" in PI.tags()
    assert "cp311-abi3-manylinux_2_34_aarch64" not in PI.tags()  # newer glibc than it has
    assert "py3-none-any" in PI.tags() and "cp312-cp312-manylinux_2_17_aarch64" not in PI.tags()


def _touch(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        (folder / n).write_bytes(b"")


def test_lacking_ships_only_what_the_device_has_not():
    none = {}
    assert wheels.lacking(none, ["cryptography"]) == ["cryptography", "cffi"]
    # a device with its own blosc2 keeps it, and its dependencies, whatever they are
    assert wheels.lacking({"blosc2": True}, ["blosc2"]) == []
    have_some = {"msgpack": True, "idna": True}
    assert wheels.lacking(have_some, ["blosc2"]) == ["blosc2", "ndindex", "numexpr",
                                                     "threadpoolctl", "httpx"]
    assert wheels.groups_for("none") == ("cryptography",)
    assert wheels.groups_for("zstd") == wheels.groups_for(None) == ("cryptography", "blosc2")


def test_wheels_for_picks_the_observers_version_the_device_can_load(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(tmp_path))
    mine = wheels.observer_version("cryptography")
    folder = wheels.cache_dir(PI)
    _touch(folder, f"cryptography-{mine}-cp311-abi3-manylinux_2_28_aarch64.whl",
           "cryptography-99.0.0-cp311-abi3-manylinux_2_28_aarch64.whl",  # newer, not ours
           "cffi-1.0.0-cp311-cp311-manylinux_2_34_aarch64.whl",  # needs a newer glibc
           "cffi-1.0.0-cp311-cp311-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
           "not-a-wheel.whl")  # fmt: skip
    got = wheels.wheels_for("pi-1", PI, ["cryptography", "cffi"])
    assert [p.name for p in got] == [
        f"cryptography-{mine}-cp311-abi3-manylinux_2_28_aarch64.whl",
        "cffi-1.0.0-cp311-cp311-manylinux2014_aarch64.manylinux_2_17_aarch64.whl"]
    with pytest.raises(TracrError) as info:
        wheels.wheels_for("pi-1", PI, ["cryptography", "blosc2", "numexpr"])
    assert "blosc2, numexpr" in info.value.message and "python 3.11.2" in info.value.message
    assert "tracr device prepare pi-1" in info.value.hint
    assert wheels.wheels_for("pi-1", PI, []) == []


def test_deps_report_says_what_is_lacking_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(tmp_path))
    _touch(wheels.cache_dir(X86), "idna-3.20-py3-none-any.whl")
    found = {m: True for g in DEVICE_DEPS.values() for mods in g.values() for m in mods}
    found.update(blosc2=False, idna=False)
    check = {"status": "ok", "platform": X86.__dict__, "modules": found}
    rep = wheels.deps_report(check)
    assert rep["lacks"] == ["blosc2", "idna"] and rep["cached"] == ["idna"]
    assert rep["uncached"] == ["blosc2"] and rep["platform"] == X86.key
    assert wheels.deps_report({"status": "unreachable"}) is None


def _wheel(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _unpack():
    scope: dict = {}
    exec(wheels.UNPACK_SNIPPET, scope)
    return scope["_tracr_unpack_wheel"]


def test_unpacking_a_wheel_installs_it_purelib_and_platlib_included(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    blob = _wheel({
        "demo/__init__.py": b"from demo._ext import X\n",
        "demo-1.0.dist-info/METADATA": b"Name: demo\nVersion: 1.0\n",
        "demo-1.0.data/platlib/demo/_ext.py": b"X = 42\n",
        "demo-1.0.data/purelib/demo_extra.py": b"Y = 1\n",
        "demo-1.0.data/scripts/demo-cli": b"#!/bin/sh\n",
    })  # fmt: skip
    _unpack()(io.BytesIO(blob), str(site))
    assert sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()) == [
        "demo-1.0.dist-info/METADATA", "demo/__init__.py", "demo/_ext.py", "demo_extra.py"]
    out = subprocess.run([sys.executable, "-c", "import demo, demo_extra; print(demo.X)"],
                         cwd=site, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert out.stdout.strip() == "42", out.stderr


@pytest.mark.parametrize("name", ["../evil.py", "demo-1.0.data/purelib/../../evil.py",
                                  "/abs/evil.py"])  # fmt: skip
def test_unpacking_refuses_members_outside_site_packages(tmp_path, name):
    site = tmp_path / "a" / "site"
    site.mkdir(parents=True)
    if name.startswith("/"):  # an absolute name lands inside (zip names are relative)
        _unpack()(io.BytesIO(_wheel({name: b"x"})), str(site))
        assert (site / "abs" / "evil.py").exists()
        return
    with pytest.raises(ValueError, match="outside"):
        _unpack()(io.BytesIO(_wheel({name: b"x"})), str(site))
    assert not list(tmp_path.rglob("evil.py"))


def test_bootstrap_unpacks_the_shipped_wheels_into_its_temp_venv(tmp_path):
    """The exchange the SSH launcher has with the bootstrap, over local pipes."""
    from app_api.launch.bundle import wheels_payload

    whl = tmp_path / "tracr_fake_dep-1.0-py3-none-any.whl"
    whl.write_bytes(_wheel({"tracr_fake_dep.py": b"VALUE = 'shipped'\n"}))
    cmd = bootstrap_command(sys.executable, {"need": ["torch"], "ship": ["tracr_fake_dep"]})
    env = dict(os.environ, TMPDIR=str(tmp_path))
    blob = build_bundle()
    # the launcher waits for the report before it sends the wheels; a pipe holds them anyway
    cp = subprocess.run(["sh", "-c", cmd], input=bundle_header(blob) + blob
                        + wheels_payload([whl]), capture_output=True, env=env, timeout=60)
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout.decode().splitlines()
    need = json.loads(next(ln for ln in out if ln.startswith(NEED_PREFIX)).split(" ", 1)[1])
    assert need["found"] == {"tracr_fake_dep": False, "torch": True}
    assert need["platform"]["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    boot = json.loads(next(ln for ln in out if ln.startswith("TRACR-BOOT ")).split(" ", 1)[1])
    code = "import tracr_fake_dep as m; print(m.VALUE, m.__file__)"
    got = subprocess.run([boot["python"], "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()  # fmt: skip
    assert got[0] == "shipped" and got[1].startswith(os.path.join(boot["dir"], "venv"))


# What a device has: the standard library, torch and what it brings, what deploy ships.
# The child's sys.path keeps the standard library and this checkout and trades the
# observer's site-packages for a folder of links to exactly those packages, as on a bare
# device (optional imports, such as blosc2's of click where it is installed, then take
# their fallback); every device-side module is imported, and a compressing codec and the
# data path's cipher run once.
IMPORTS = textwrap.dedent("""
    import importlib, pkgutil, sys
    sys.path = [p for p in sys.path if "-packages" not in p] + [sys.argv[1]]
    importlib.invalidate_caches()
    import experiment_design, MyDatasets
    for pkg in (experiment_design, MyDatasets):
        for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            importlib.import_module(mod.name)
    import blosc2, numpy
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    packed = blosc2.compress2(numpy.arange(1000, dtype="f4"), codec=blosc2.Codec.ZSTD)
    AESGCM(AESGCM.generate_key(128)).encrypt(b"0" * 12, packed, None)
    print(sorted(m for m in sys.modules if "-packages" in (getattr(sys.modules[m], "__file__",
                                                                   None) or "")))
""")


def test_device_deps_cover_what_a_participant_imports(tmp_path):
    """With only the standard library, torch's dependency closure, rpyc and the packages
    of DEVICE_DEPS to import from, every device-side module imports and blosc2 and the
    cipher work: what a participant needs beyond torch is what deploy ships."""
    from importlib.metadata import distribution

    from app_api.launch.bundle import PURE_DEPS
    from tests.integration.test_device_bare import torch_closure

    tops = set(torch_closure())
    for dist in [*(d for g in DEVICE_DEPS.values() for d in g), *PURE_DEPS]:
        found = distribution(dist)
        tops |= {(str(found.locate_file(f.parts[0])), f.parts[0]) for f in found.files
                 if f.parts[0] not in ("..", "__pycache__")}  # fmt: skip
    for src, name in tops:
        (tmp_path / name).symlink_to(src)
    cp = subprocess.run([sys.executable, "-c", IMPORTS, str(tmp_path)], cwd=REPO,
                        capture_output=True, text=True, timeout=300)  # fmt: skip
    assert cp.returncode == 0, ("a device-side import needs a package that is neither "
                                f"torch's nor shipped: add it to DEVICE_DEPS\n{cp.stderr}")
    assert "-packages" not in cp.stdout  # nothing came from the observer's site-packages
