"""The observer's wheel cache: what a participant needs beyond torch, for each device platform.

A device needs only Python and torch/torchvision (with numpy and pillow, which
they bring). Everything else a participant imports is shipped at deploy:
pure Python in the bundle (``rpyc``), binary wheels from this cache. What a
participant imports beyond torch was measured, not guessed (an import audit
hook on a participant of ``alexnet-sweep`` with zstd; the unit test
``test_device_deps_cover_what_a_participant_imports`` repeats it):
``cryptography`` (and ``cffi``'s ``_cffi_backend``) for the authenticated data
path, and ``blosc2`` (with ``ndindex``, ``msgpack``, ``numexpr``,
``threadpoolctl``, and ``httpx`` and ``idna``, which blosc2 imports at import
time) for compressed transport.

The cache lives in ``$TRACR_CONFIG_DIR/wheels/<cpXY>-<platform>/`` (the
device's python version and its most specific platform tag, e.g.
``cp311-manylinux_2_35_x86_64``). ``tracr device prepare NAME`` fills it
while the observer is online (``pip download --only-binary=:all: --platform
... --python-version ...``), pinned to the observer's own versions where a
wheel exists, so both ends speak the same protocol; a device that is offline
then still gets what it needs. At deploy, :func:`wheels_for` picks the
wheels of what the device lacks (never what its own python has).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app_api.devices.registry import config_dir
from experiment_design.errors import TracrError

#: what a participant imports beyond torch, torchvision, numpy and pillow, by group: a
#: group's first distribution is its root (a device that has the root keeps its own
#: group); each member is ``distribution -> the modules it provides``
DEVICE_DEPS: dict[str, dict[str, tuple[str, ...]]] = {
    "cryptography": {"cryptography": ("cryptography",), "cffi": ("_cffi_backend",)},
    "blosc2": {
        "blosc2": ("blosc2",), "ndindex": ("ndindex",), "msgpack": ("msgpack",),
        "numexpr": ("numexpr",), "threadpoolctl": ("threadpoolctl",), "httpx": ("httpx",),
        "idna": ("idna",),
    },
}  # fmt: skip
#: the groups every participant needs; ``blosc2`` too unless the transport is known not to
#: compress (a launcher is not always told the codec, and a run may sweep several)
ALWAYS = ("cryptography",)
PIP_TIMEOUT_S = 600.0

# Runs on the device (stdlib, Python 3.6 syntax): the facts wheel selection needs.
PLATFORM_SNIPPET = r"""
def _tracr_platform():
    import os, platform, struct, sys
    libc, ver = platform.libc_ver()
    if not libc and hasattr(os, "confstr"):
        try:
            libc, ver = (os.confstr("CS_GNU_LIBC_VERSION") or " ").split(" ", 1)
        except (ValueError, OSError):
            pass
    if not libc and sys.platform.startswith("linux"):
        import glob
        if glob.glob("/lib/ld-musl-*"):
            libc = "musl"
            try:
                import subprocess
                out = subprocess.run([glob.glob("/lib/ld-musl-*")[0]], stderr=subprocess.PIPE,
                                     timeout=5).stderr.decode()
                ver = out.split("Version", 1)[1].split()[0]
            except Exception:
                ver = ""
    return {"python": platform.python_version(), "impl": sys.implementation.name,
            "system": platform.system(), "machine": platform.machine(),
            "bits": struct.calcsize("P") * 8, "libc": libc, "libc_version": ver,
            "mac_version": platform.mac_ver()[0]}
"""


def distributions(groups: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``distribution -> modules`` of ``groups`` (names of :data:`DEVICE_DEPS`), in order."""
    out: dict[str, tuple[str, ...]] = {}
    for g in groups:
        out.update(DEVICE_DEPS[g])
    return out


def groups_for(codec: str | None) -> tuple[str, ...]:
    """The dependency groups a participant with transport codec ``codec`` (None: not
    known) needs."""
    return ALWAYS + (("blosc2",) if codec != "none" else ())


def lacking(found: Mapping[str, bool], groups: Iterable[str]) -> list[str]:
    """Distributions to ship, given which modules the device's python ``found``.

    A group whose root the device has is the device's own business (its blosc2
    comes with its own dependencies); otherwise every member the device lacks.
    """
    out = []
    for g in groups:
        members = DEVICE_DEPS[g]
        root = next(iter(members))
        if all(found.get(m) for m in members[root]):
            continue
        out += [d for d, mods in members.items() if not all(found.get(m) for m in mods)]
    return out


@dataclass(frozen=True)
class DevicePlatform:
    """What decides which wheels a device's python can load (from ``PLATFORM_SNIPPET``)."""

    python: str  # "3.11.7"
    impl: str = "cpython"
    system: str = "Linux"
    machine: str = "x86_64"
    bits: int = 64
    libc: str = "glibc"
    libc_version: str = ""
    mac_version: str = ""

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any]) -> DevicePlatform:
        """From the snippet's dict (unknown keys ignored)."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in facts.items() if k in names and v is not None})

    @property
    def version(self) -> tuple[int, int]:
        """(major, minor) of the device's python."""
        major, minor = self.python.split(".")[:2]
        return int(major), int(minor)

    @property
    def cp(self) -> str:
        """``cp311`` for CPython 3.11."""
        return "cp{}{}".format(*self.version)

    @property
    def arch(self) -> str:
        """The wheel architecture: a 32-bit userland on a 64-bit ARM kernel is armv7l."""
        m = self.machine.lower()
        m = {"amd64": "x86_64", "arm64": "aarch64" if self.system == "Linux" else "arm64",
             "i386": "i686", "x86": "i686"}.get(m, m)  # fmt: skip
        if self.bits == 32:
            m = {"aarch64": "armv7l", "x86_64": "i686"}.get(m, m)
        return m

    def platforms(self) -> list[str]:
        """The platform tags the device accepts, most specific first."""
        arch = self.arch
        if self.system == "Linux":
            tags = []
            nums = [int(x) for x in re.findall(r"\d+", self.libc_version)[:2]]
            if self.libc == "glibc" and len(nums) == 2:
                floor = 5 if arch in ("x86_64", "i686") else 17
                for minor in range(nums[1], floor - 1, -1):
                    tags.append(f"manylinux_{nums[0]}_{minor}_{arch}")
                    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
                    if minor in legacy and (minor == 17 or arch in ("x86_64", "i686")):
                        tags.append(f"{legacy[minor]}_{arch}")
            elif self.libc == "musl" and len(nums) == 2:
                tags += [f"musllinux_{nums[0]}_{m}_{arch}" for m in range(nums[1], -1, -1)]
            return tags + [f"linux_{arch}"]
        if self.system == "Darwin" and self.mac_version:
            from packaging.tags import mac_platforms

            major, minor = (int(x) for x in (self.mac_version.split(".") + ["0"])[:2])
            return list(mac_platforms((major, minor), arch))
        if self.system == "Windows":
            return ["win_amd64" if arch == "x86_64" else f"win_{arch}"]
        return []

    @property
    def key(self) -> str:
        """The cache directory's name: ``cp311-manylinux_2_35_x86_64``."""
        plats = self.platforms()
        return f"{self.cp}-{plats[0] if plats else 'any'}"

    def tags(self) -> set[str]:
        """Every wheel tag (``cp311-abi3-manylinux_2_17_x86_64``, ``py3-none-any``...) it loads."""
        from packaging.tags import compatible_tags, cpython_tags

        plats = self.platforms()
        found = set()
        if self.impl == "cpython":
            found |= {str(t) for t in cpython_tags(self.version, platforms=plats)}
        found |= {str(t) for t in compatible_tags(self.version, self.cp, platforms=plats)}
        return found


def cache_root() -> Path:
    """``$TRACR_CONFIG_DIR/wheels``."""
    return config_dir() / "wheels"


def cache_dir(platform: DevicePlatform) -> Path:
    """Where the wheels for ``platform`` live."""
    return cache_root() / platform.key


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_wheel(platform: DevicePlatform, dist: str) -> Path | None:
    """A cached wheel of ``dist`` the device can load: the observer's version if cached,
    else the newest; None when the cache has none."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import Version

    folder = cache_dir(platform)
    if not folder.is_dir():
        return None
    ok = platform.tags()
    mine = observer_version(dist)
    best: tuple[tuple, Path] | None = None
    for path in folder.glob("*.whl"):
        try:
            name, version, _, tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if _canon(name) != _canon(dist) or not {str(t) for t in tags} & ok:
            continue
        rank = (str(version) == mine, version if isinstance(version, Version) else Version("0"))
        if best is None or rank > best[0]:
            best = (rank, path)
    return best[1] if best else None


def observer_version(dist: str) -> str | None:
    """The version of ``dist`` installed where the observer runs (None if absent)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def wheels_for(device_name: str, platform: DevicePlatform, dists: Iterable[str]) -> list[Path]:
    """The cached wheels of ``dists`` for ``platform``; a TracrError naming every package
    the cache lacks (and the command that fetches them) when it does not cover them."""
    found, absent = [], []
    for d in dists:
        path = find_wheel(platform, d)
        (found if path else absent).append(path or d)
    if absent:
        raise TracrError(
            f"device {device_name} lacks {', '.join(absent)} (python {platform.python}, "
            f"{platform.key}), and the wheel cache {cache_dir(platform)} has no wheel of "
            f"{'it' if len(absent) == 1 else 'them'}.",
            hint=f"while online: tracr device prepare {device_name}   (or install "
            f"{' '.join(absent)} on the device, then: tracr device check {device_name})",
        )
    return found


def pip_download(platform: DevicePlatform, dists: Iterable[str],
                 timeout: float = PIP_TIMEOUT_S) -> list[str]:
    """Fill the cache for ``platform`` with ``dists`` (binary wheels only, no dependencies:
    the list is already the closure). Pinned to the observer's version; a package with no
    such wheel for the platform is fetched at its newest version that has one. Returns
    one line per package saying what was fetched."""
    dists = [d for d in dists if find_wheel(platform, d) is None]
    if not dists:
        return []
    folder = cache_dir(platform)
    folder.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:", "--python-version", "{}.{}".format(*platform.version),
            "--implementation", "cp" if platform.impl == "cpython" else "py",
            "--abi", platform.cp if platform.impl == "cpython" else "none", "-d", str(folder)]
    for p in platform.platforms() or ["any"]:
        base += ["--platform", p]
    pinned = [f"{d}=={observer_version(d)}" if observer_version(d) else d for d in dists]
    if _pip(base + pinned, timeout).returncode == 0:
        return [f"{p}: fetched" for p in pinned]
    lines = []
    for d, pin in zip(dists, pinned, strict=True):  # which one has no wheel, and the fallback
        if find_wheel(platform, d) is not None:
            lines.append(f"{pin}: fetched")
            continue
        if pin != d and _pip(base + [pin], timeout).returncode == 0:
            lines.append(f"{pin}: fetched")
            continue
        cp = _pip(base + [d], timeout)
        if cp.returncode != 0:
            tail = (cp.stderr or cp.stdout).strip().splitlines()[-1:] or ["no output"]
            raise TracrError(f"pip found no wheel of {d} for {platform.key}: {tail[0]}",
                             hint="point pip at an index that has one (PIP_EXTRA_INDEX_URL; "
                             "piwheels.org for 32-bit ARM), or install it on the device")
        got = find_wheel(platform, d)
        lines.append(f"{d}: no wheel of {pin} for {platform.key}; fetched {got.name if got else d}")
    return lines


def _pip(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise TracrError(f"pip download did not finish in {timeout:.0f} s",
                         hint="check the observer's connection to the package index") from exc


# Runs on the device (stdlib, Python 3.6 syntax): a wheel is a zip; unpacking one into a
# site-packages directory is installing it (no pip on the device). ``X.data/purelib`` and
# ``X.data/platlib`` belong in site-packages too; scripts, headers and data are not needed.
UNPACK_SNIPPET = r"""
def _tracr_unpack_wheel(fileobj, site):
    import os, shutil, zipfile
    root = os.path.realpath(site)
    with zipfile.ZipFile(fileobj) as zf:
        for info in zf.infolist():
            parts = [p for p in info.filename.split("/") if p]
            if not parts or info.filename.endswith("/"):
                continue
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            dst = os.path.realpath(os.path.join(root, *parts))
            if not dst.startswith(root + os.sep):
                raise ValueError("wheel member %r points outside %s" % (info.filename, site))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with zf.open(info) as src, open(dst, "wb") as out:
                shutil.copyfileobj(src, out)
"""


def deps_report(check: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a device lacks (per its last check) and whether the cache covers it:
    ``{"platform", "lacks", "cached", "uncached"}``; None when the check recorded no
    platform (the device was unreachable, or checked by an older tracr)."""
    check = check or {}
    if not check.get("platform") or not isinstance(check.get("modules"), dict):
        return None
    platform = DevicePlatform.from_facts(check["platform"])
    lacks = lacking(check["modules"], DEVICE_DEPS)
    cached = [d for d in lacks if find_wheel(platform, d) is not None]
    return {"platform": platform.key, "python": platform.python, "lacks": lacks,
            "cached": cached, "uncached": [d for d in lacks if d not in cached]}
