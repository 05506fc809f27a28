"""What zero-deploy ships to a device, as one gzip'd tar stream, and the remote bootstrap.

The bundle holds ``experiment_design/``, ``MyDatasets/`` (sample images
included) and the pure-Python dependencies the participant needs that a
device may lack (``rpyc``, which imports only the standard library). The
observer's own copies are shipped so both ends speak the same rpyc protocol.
torch, torchvision, numpy and pillow are reused from the device's python
through a ``.pth`` file in the temporary venv, and so is any other package
the device's python has. The binary dependencies it lacks (cryptography,
blosc2 and theirs: :mod:`app_api.devices.wheels`) follow the bundle as wheels
from the observer's cache, unpacked into the temp venv's site-packages, so
they go with it.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shlex
import tarfile
import threading
from pathlib import Path

from app_api.devices.wheels import PLATFORM_SNIPPET, UNPACK_SNIPPET
from experiment_design.errors import TracrError
from experiment_design.protocol import PARTICIPANT_MODULE
from experiment_design.registry import plugin_modules

# Pure-python packages shipped into DIR/deps (import name -> module providing its path).
PURE_DEPS = ("rpyc",)
#: the bootstrap's one-line JSON report (dir, venv python, pid, found/missing modules)
BOOT_PREFIX = "TRACR-BOOT "
#: asked to ship wheels, the bootstrap first reports which of the modules it was given the
#: device's python has, and its platform, then reads ``TRACR-WHEELS <n>`` and a tar of wheels
NEED_PREFIX = "TRACR-NEED "
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
_cache: dict[tuple, bytes] = {}
_lock = threading.Lock()


def _package_dir(name: str) -> Path:
    module = __import__(name)
    return Path(module.__file__).resolve().parent


def bundle_sources() -> list[tuple[Path, str]]:
    """(local directory, name inside the bundle) pairs that make up the bundle."""
    items = [(_package_dir("experiment_design"), "experiment_design"),
             (_package_dir("MyDatasets"), "MyDatasets")]
    items += [(_package_dir(dep), f"deps/{dep}") for dep in PURE_DEPS]
    # a user's plugin packages ($TRACR_PLUGINS, app_api.plugins), found where the observer
    # imports them from; the participant imports them by name from deps/
    for top in sorted({m.split(".")[0] for m in plugin_modules()}):
        if top in ("experiment_design", "MyDatasets"):
            continue
        module = __import__(top)
        if not hasattr(module, "__path__"):
            raise TracrError(f"the plugin {top} is a single module, which cannot be shipped",
                             hint="put it in a package (a folder with __init__.py)")
        items.append((_package_dir(top), f"deps/{top}"))
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


# Runs on the device with the device's python (3.6+ syntax, stdlib only), as the one
# SSH command of a deploy. stdin carries "TRACR-BUNDLE <n>\n", n bytes of tar.gz, then
# whatever the participant reads (its secret line; EOF when the observer goes). The
# bundle is read with os.read on fd 0 so no buffered reader swallows the bytes after
# it. It makes DIR and DIR/venv, points the venv at the device's site-packages,
# (when the config names modules to ``ship``) reports which of them the device has and
# its platform, reads "TRACR-WHEELS <n>\n" and n bytes of tar holding the wheels to
# unpack into the venv, reports one JSON line, and then (when the config names participant args) execs
# ``sh -c 'cd DIR && venv/bin/python -m MODULE ARGS...; rm -rf DIR'`` so the
# temp dir goes away however python ends. On failure it removes DIR itself.
BOOTSTRAP = PLATFORM_SNIPPET + UNPACK_SNIPPET + r"""
import base64, importlib.util, io, json, os, shlex, shutil, sys, tarfile, tempfile, venv
cfg = json.loads(base64.b64decode(sys.argv[1]).decode()) if len(sys.argv) > 1 else {}

def read_exact(n):
    chunks = []
    while n > 0:
        b = os.read(0, min(n, 1 << 20))
        if not b:
            raise EOFError("bundle cut short")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)

def read_line():
    out = b""
    while not out.endswith(b"\n"):
        b = os.read(0, 1)
        if not b:
            raise EOFError("no bundle header")
        out += b
    return out.decode()

d = tempfile.mkdtemp(prefix="tracr-")
try:
    head = read_line().split()
    if len(head) != 2 or head[0] != "TRACR-BUNDLE":
        raise ValueError("bad bundle header %r" % " ".join(head))
    with tarfile.open(fileobj=io.BytesIO(read_exact(int(head[1]))), mode="r:gz") as tf:
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
    if cfg.get("ship") is not None:  # what the device lacks of these, as wheels
        print("TRACR-NEED " + json.dumps({"found": {m: importlib.util.find_spec(m) is not None
              for m in cfg["ship"] + ["torch"]}, "platform": _tracr_platform()}))
        sys.stdout.flush()
        head = read_line().split()
        if len(head) != 2 or head[0] != "TRACR-WHEELS":
            raise ValueError("bad wheels header %r" % " ".join(head))
        blob = read_exact(int(head[1]))
        if blob:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tf:
                for m in tf.getmembers():
                    if m.isfile() and m.name.endswith(".whl"):
                        _tracr_unpack_wheel(io.BytesIO(tf.extractfile(m).read()), sp)
            sys.path.append(sp)
            importlib.invalidate_caches()
    found = {m: importlib.util.find_spec(m) is not None for m in ("torch", "torchvision", "numpy", "blosc2", "PIL")}
    missing = [m for m in cfg.get("need", []) if not found.get(m)]
    py = os.path.join(vdir, "bin", "python")
    print("TRACR-BOOT " + json.dumps({"dir": d, "python": py, "pid": os.getpid(),
          "version": "%d.%d.%d" % sys.version_info[:3], "site_dirs": site_dirs, "found": found,
          "missing": missing}))
    sys.stdout.flush()
except BaseException as exc:
    shutil.rmtree(d, ignore_errors=True)
    print("TRACR-BOOT-FAILED %s: %s" % (type(exc).__name__, exc))
    sys.exit(3)
if missing:
    shutil.rmtree(d, ignore_errors=True)
    sys.exit(4)
if cfg.get("args") is not None:
    argv = [py, "-m", cfg["module"]] + cfg["args"] + [
        "--workdir", d, "--cleanup-workdir"]
    q = shlex.quote(d)
    os.environ["PYTHONUNBUFFERED"] = "1"
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    # torch writes compile caches to $TMPDIR/torchinductor_<user> by default; keep them
    # in DIR so they go with it
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        os.environ.setdefault(var, os.path.join(d, "cache", sub))
    os.execv("/bin/sh", ["sh", "-c", "cd %s && %s; rm -rf %s" % (q, " ".join(shlex.quote(a) for a in argv), q)])
"""


def bundle_header(bundle: bytes) -> bytes:
    """The line that precedes the bundle on the bootstrap's stdin."""
    return f"TRACR-BUNDLE {len(bundle)}\n".encode()


def wheels_payload(wheels: list[Path]) -> bytes:
    """The ``TRACR-WHEELS`` header and an uncompressed tar of ``wheels`` (zips already)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tf:
        for path in wheels:
            info = tf.gettarinfo(str(path), path.name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o644
            with open(path, "rb") as fh:
                tf.addfile(info, fh)
    body = buf.getvalue() if wheels else b""
    return f"TRACR-WHEELS {len(body)}\n".encode() + body


def bootstrap_command(python: str, config: dict | None = None) -> str:
    """Remote shell command running :data:`BOOTSTRAP` with ``python``.

    ``config`` (JSON, shipped base64 in argv): ``need`` lists modules the run cannot do
    without (the bootstrap stops before starting anything when one is missing);
    ``ship`` lists modules the observer can ship as wheels (the bootstrap then reports
    :data:`NEED_PREFIX` and waits for :func:`wheels_payload`);
    ``args`` are participant arguments, given which the bootstrap becomes
    ``python -m <module> ARGS`` (``module``: :data:`experiment_design.protocol.PARTICIPANT_MODULE`).
    """
    if config is not None and "args" in config:
        config = {"module": PARTICIPANT_MODULE, **config}
    code = base64.b64encode(BOOTSTRAP.encode()).decode()
    cmd = f"{shlex.quote(python)} -c \"import base64;exec(base64.b64decode('{code}'))\""
    if config is not None:
        cmd += " " + base64.b64encode(json.dumps(config).encode()).decode()
    return cmd
