"""SSH plumbing without a network: options, failure text, the shipped bundle and bootstrap."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import shutil
import subprocess
import tarfile

import pytest

from app_api.devices import ssh
from app_api.devices.registry import Device, known_hosts_path
from app_api.launch.bundle import BOOTSTRAP, bootstrap_command, build_bundle
from experiment_design.errors import TracrError


def _dev(**kw) -> Device:
    base = dict(name="pi4", host="10.0.0.7", user="pi", port=2222, key="/keys/id_ed25519")
    base.update(kw)
    return Device(**base)


def test_ssh_options_check_host_keys_against_tracrs_known_hosts():
    opts = ssh.ssh_options(_dev())
    joined = " ".join(opts)
    assert "StrictHostKeyChecking=yes" in joined and "BatchMode=yes" in joined
    assert f"UserKnownHostsFile={known_hosts_path()}" in joined
    assert "GlobalKnownHostsFile=/dev/null" in joined
    assert opts[opts.index("-i") + 1] == "/keys/id_ed25519" and opts[opts.index("-p") + 1] == "2222"
    assert "-p" not in ssh.ssh_options(_dev(port=22))
    own = ssh.ssh_options(_dev(known_hosts="/lab/known_hosts"))
    assert "UserKnownHostsFile=/lab/known_hosts" in own
    mux = " ".join(ssh.ssh_options(_dev(), control_path="/tmp/x/cm"))
    assert "ControlPath=/tmp/x/cm" in mux and "ControlPersist=no" in mux
    assert ssh.ssh_argv(_dev(), "true")[-2:] == ["pi@10.0.0.7", "true"]


def test_classify_ssh_failures():
    changed = (
        "@@@@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
        "Host key verification failed.\n"
    )
    assert ssh.classify_ssh_failure(changed) == ssh.HOST_KEY_CHANGED
    unknown = "No ED25519 host key is known for [h]:22 and you have requested strict checking.\nHost key verification failed."
    assert ssh.classify_ssh_failure(unknown) == ssh.HOST_KEY_UNKNOWN
    assert ssh.classify_ssh_failure("pi@h: Permission denied (publickey).") == ssh.LOGIN_FAILED
    assert (
        ssh.classify_ssh_failure("ssh: connect to host h port 22: Connection refused")
        == ssh.UNREACHABLE
    )
    assert ssh.classify_ssh_failure("python3: not found") is None


def test_host_key_changed_error_says_how_to_rekey():
    err = ssh.ssh_error(_dev(), ssh.HOST_KEY_CHANGED, "block")
    assert (
        "host key for pi4 changed; if expected, run `tracr device pair --name pi4 --rekey`"
        in err.message
    )


def test_failure_block_is_aligned_like_plumbum():
    block = ssh.failure_block(["python3", "-c", "x y"], "pi4", 1, "", "line one\nline two")
    lines = block.splitlines()
    assert [ln[:14] for ln in lines[:5]] == [
        "Command line |", "Host         |", "Exit code    |", "Stdout       |", "Stderr       |",
    ]  # fmt: skip
    assert "python3 -c 'x y'" in lines[0]
    assert lines[-1] == " " * 15 + "line two"


def test_bundle_ships_sources_and_pure_deps_without_bytecode():
    data = build_bundle()
    assert build_bundle() is data  # cached while nothing changes
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        names = tf.getnames()
    assert "experiment_design/participant.py" in names
    assert "deps/rpyc/__init__.py" in names
    assert any(n.startswith("MyDatasets/") for n in names)
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n]
    assert not [n for n in names if n.startswith(("app_api/", "tests/"))]


def test_bootstrap_command_carries_the_script_intact():
    cmd = bootstrap_command("/opt/py 3/bin/python")
    assert cmd.startswith("'/opt/py 3/bin/python' -c ")
    code = re.search(r"b64decode\('([^']+)'\)", cmd).group(1)
    assert base64.b64decode(code).decode() == BOOTSTRAP
    compile(BOOTSTRAP, "<bootstrap>", "exec")


ODD_PATHS = ["/home/a b/.config/tracr", '/tmp/q"x\\y #z %h', "/tmp/it's %%", "/plain/path"]


@pytest.mark.skipif(not shutil.which("ssh"), reason="needs the OpenSSH client")
@pytest.mark.parametrize("folder", ODD_PATHS)
def test_paths_in_ssh_options_reach_ssh_as_one_path(folder):
    # ssh parses -o values itself (`ssh -G` prints what it understood; no connection).
    # Before: an unquoted space gave ControlPath "extra arguments" and split
    # UserKnownHostsFile into two files; `%h` became the host name.
    dev = _dev(known_hosts=f"{folder}/known_hosts", key=f"{folder}/id_ed25519")
    argv = ["ssh", "-G", *ssh.ssh_options(dev, control_path=f"{folder}/cm"), "pi@10.0.0.7"]
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    assert cp.returncode == 0, cp.stderr
    seen = dict(ln.split(" ", 1) for ln in cp.stdout.splitlines() if " " in ln)
    assert seen["controlpath"] == f"{folder}/cm"
    assert seen["userknownhostsfile"] == f"{folder}/known_hosts"


def test_ssh_config_value_quotes_only_what_needs_it():
    assert ssh.config_value("/plain/path-1.2_x") == "/plain/path-1.2_x"
    assert ssh.config_value("/a b/c%d") == '"/a b/c%%d"'
    assert ssh.config_value('/a"b\\c') == '"/a\\"b\\\\c"'
    with pytest.raises(TracrError, match="cannot use the path"):
        ssh.config_value("/x/${HOME}/y")


def test_fingerprint_is_openssh_sha256():
    blob = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519" + bytes(36)).decode()
    fp = ssh.fingerprint(f"[h]:2222 ssh-ed25519 {blob}")
    digest = base64.b64encode(hashlib.sha256(base64.b64decode(blob)).digest()).decode()
    assert fp == f"ED25519 key fingerprint is SHA256:{digest.rstrip('=')}"
