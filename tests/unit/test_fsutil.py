"""Safe file writing: atomic, no links followed, the invoking user's under sudo."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import pytest

from app_api import fsutil
from experiment_design.errors import TracrError

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to another user)")


@pytest.fixture
def sudo_as_nobody(monkeypatch):
    """Simulate ``sudo`` run by the unprivileged user ``nobody``."""
    monkeypatch.setenv("SUDO_UID", str(NOBODY))
    monkeypatch.setenv("SUDO_GID", str(NOBODY))


@contextlib.contextmanager
def as_user(uid: int):
    """Run the body with effective uid/gid ``uid`` (root gets both back afterwards)."""
    os.setegid(uid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def test_atomic_write_replaces_and_sets_mode(tmp_path):
    target = tmp_path / "a" / "b" / "f.txt"
    fsutil.atomic_write(target, "one")
    fsutil.atomic_write(target, b"two", mode=0o600)
    assert target.read_text() == "two"
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.txt"]  # no temp left


def test_a_planted_link_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "cfg" / "devices.yaml"
    link.parent.mkdir()
    link.symlink_to(victim)
    fsutil.atomic_write(link, "new")
    assert victim.read_text() == "keep"
    assert not link.is_symlink() and link.read_text() == "new"
    again = tmp_path / "again"
    again.symlink_to(victim)
    with pytest.raises(TracrError, match="symbolic link"):
        fsutil.read_text(again)


def test_a_linked_parent_directory_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "cfg").symlink_to(tmp_path / "real")
    with pytest.raises(TracrError, match="not a directory"):
        fsutil.atomic_write(tmp_path / "cfg" / "f", "x")
    assert list((tmp_path / "real").iterdir()) == []


def test_not_under_sudo_nothing_is_given_away(tmp_path, monkeypatch):
    monkeypatch.delenv("SUDO_UID", raising=False)
    assert fsutil.invoking_user() is None
    f = fsutil.atomic_write(tmp_path / "x" / "f", "x")
    assert f.stat().st_uid == os.geteuid()


@root_only
def test_under_sudo_files_and_new_dirs_belong_to_the_user(tmp_path, sudo_as_nobody):
    assert fsutil.invoking_user() == (NOBODY, NOBODY)
    f = fsutil.atomic_write(tmp_path / "new" / "deeper" / "devices.yaml", "x", mode=0o600)
    for p in (f, f.parent, f.parent.parent):
        assert (p.stat().st_uid, p.stat().st_gid) == (NOBODY, NOBODY), p
    assert tmp_path.stat().st_uid == 0  # what existed keeps its owner
    made_by_root = tmp_path / "run-1"
    made_by_root.mkdir()
    assert fsutil.user_owned(made_by_root).stat().st_uid == NOBODY
    assert fsutil.user_owned(tmp_path / "results" / "run-2").stat().st_uid == NOBODY


@root_only
def test_root_owned_leftovers_give_a_clear_error(monkeypatch):
    """A config dir left root-owned by an older tracr under sudo: a message, no traceback."""
    monkeypatch.delenv("SUDO_UID", raising=False)
    top = Path(tempfile.mkdtemp(prefix="tracr-fsutil-"))
    try:
        top.chmod(0o755)
        cfg = top / "cfg"
        cfg.mkdir(mode=0o755)  # root's, as sudo left it
        (cfg / "devices.yaml").write_text("devices: {}\n")
        (cfg / "devices.yaml").chmod(0o600)
        with as_user(NOBODY):
            with pytest.raises(TracrError) as err:
                fsutil.read_text(cfg / "devices.yaml")
            assert "owned by root" in err.value.message and "chown" in err.value.hint
            with pytest.raises(TracrError) as err:
                fsutil.atomic_write(cfg / "known_hosts", "x")
            assert "chown" in err.value.hint
    finally:
        import shutil

        shutil.rmtree(top)
