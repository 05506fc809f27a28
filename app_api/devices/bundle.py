"""What zero-deploy ships to a device, as one gzip'd tar stream, and the remote bootstrap.

The bundle holds ``experiment_design/``, ``MyDatasets/`` (sample images
included) and the pure-Python dependencies the participant needs that a
device may lack (``rpyc``, which imports only the standard library). The
observer's own copies are shipped so both ends speak the same rpyc protocol.
Binary dependencies (torch, numpy, blosc2, pillow) are reused from the
device's python through a ``.pth`` file in the temporary venv.
"""

from __future__ import annotations

import base64
import io
import os
import tarfile
import threading
from pathlib import Path

# Pure-python packages shipped into DIR/deps (import name -> module providing its path).
PURE_DEPS = ("rpyc",)
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
_cache: dict[tuple, bytes] = {}
_lock = threading.Lock()


def _package_dir(name: str) -> Path:
    module = __import__(name)
    return Path(module.__file__).resolve().parent


def bundle_sources() -> list[tuple[Path, str]]:
    """(local directory, name inside the bundle) pairs that make up the bundle."""
    items = [(_package_dir("experiment_design"), "experiment_design")]
    try:
        items.append((_package_dir("MyDatasets"), "MyDatasets"))
    except ImportError:  # not written yet in a partial checkout
        pass
    items += [(_package_dir(dep), f"deps/{dep}") for dep in PURE_DEPS]
    return items


def _files(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for fn in sorted(filenames):
            if not fn.endswith((".pyc", ".pyo")):
                yield Path(dirpath) / fn


def build_bundle() -> bytes:
    """The tar.gz bytes to ship (cached while no shipped file changes)."""
    sources = bundle_sources()
    files = [
        (p, f"{name}/{p.relative_to(root).as_posix()}")
        for root, name in sources
        for p in _files(root)
    ]
    key = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p, _ in files)
    with _lock:
        if key in _cache:
            return _cache[key]
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tf:
            for path, arcname in files:
                info = tf.gettarinfo(str(path), arcname)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                with open(path, "rb") as fh:
                    tf.addfile(info, fh)
        _cache.clear()
        _cache[key] = buf.getvalue()
        return _cache[key]


# Runs on the device with the device's python (3.6+ syntax, stdlib only). Reads the
# bundle from stdin, makes DIR and DIR/venv, points the venv at the device's
# site-packages, and reports one JSON line. On failure it removes DIR itself.
BOOTSTRAP = r"""
import importlib.util, json, os, shutil, sys, tarfile, tempfile, venv
d = tempfile.mkdtemp(prefix="tracr-")
try:
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|gz") as tf:
        if hasattr(tarfile, "data_filter"):
            tf.extractall(d, filter="data")
        else:
            tf.extractall(d)
    site_dirs = [p for p in sys.path if p and os.path.basename(p) in ("site-packages", "dist-packages")
                 and os.path.isdir(p)]
    vdir = os.path.join(d, "venv")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(vdir)
    sp = os.path.join(vdir, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    with open(os.path.join(sp, "_tracr_device_site.pth"), "w") as fh:
        fh.write(os.path.join(d, "deps") + "\n")
        for p in site_dirs:
            fh.write("import site; site.addsitedir(%r)\n" % p)
    found = {m: importlib.util.find_spec(m) is not None for m in ("torch", "torchvision", "numpy", "blosc2", "PIL")}
    print("TRACR-BOOT " + json.dumps({"dir": d, "python": os.path.join(vdir, "bin", "python"),
          "version": "%d.%d.%d" % sys.version_info[:3], "site_dirs": site_dirs, "found": found}))
except BaseException as exc:
    shutil.rmtree(d, ignore_errors=True)
    print("TRACR-BOOT-FAILED %s: %s" % (type(exc).__name__, exc))
    sys.exit(3)
"""


def bootstrap_command(python: str) -> str:
    """Remote shell command running :data:`BOOTSTRAP` with ``python`` (bundle on stdin)."""
    import shlex

    code = base64.b64encode(BOOTSTRAP.encode()).decode()
    return f"{shlex.quote(python)} -c \"import base64;exec(base64.b64decode('{code}'))\""
