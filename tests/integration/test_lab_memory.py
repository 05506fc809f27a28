"""A lab host's memory cap on this machine's kernel (cgroups v1 memory controller): a
process inside the cap runs, one that outgrows it is killed there and the cgroup says so,
and the cgroup is removed after."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app_api.lab import memory

pytestmark = [
    pytest.mark.integration, pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
    pytest.mark.skipif(not (memory.MEMORY_ROOT / "memory.limit_in_bytes").exists(),
                       reason="no cgroups v1 memory controller"),
]
_GROW = ("import sys\n"
         "sys.stdin.readline()\n"  # wait until the parent has moved us into the cgroup
         "blocks = [bytearray(1 << 20) for _ in range(int(sys.argv[1]))]\n"
         "for b in blocks: b[::4096] = b'x' * len(b[::4096])\n"
         "print('grew', len(blocks))\n")


def grow(path, mib: int) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-I", "-c", _GROW, str(mib)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    memory.add_pid(path, proc.pid)
    out, err = proc.communicate("go\n", timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_process_past_a_hosts_memory_cap_is_killed_inside_it():
    state = {"hosts": [{"name": "lab-1", "ns": f"tracr-memtest-{os.getpid()}"}]}
    memory.apply(state, {"lab-1": 96 * 2**20})
    path = state["hosts"][0]["memory_cgroup"]
    try:
        assert memory.read(path)["limit_bytes"] == 96 * 2**20
        assert grow(path, 24).stdout.strip() == "grew 24"  # within the cap
        over = grow(path, 400)  # far past it: the kernel kills it, in its cgroup alone
        assert over.returncode == -9 and "grew" not in over.stdout
        seen = memory.read(path)
        # it reached the cap, never more, and the kernel's OOM killer says it killed one
        assert 24 * 2**20 < seen["max_usage_bytes"] <= 96 * 2**20
        assert seen["oom_kills"] == 1
    finally:
        assert memory.release(state) == [path]
    assert not os.path.exists(path)
