"""What a participant says reaches the observer's terminal as text, never as commands.

Real participant processes whose own code fails with a message that would retitle the
terminal window, clear the screen and (where rich renders it) restyle the text; the
failure is injected by a ``sitecustomize`` on the participants' PYTHONPATH (``SITE``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
#: retitle the window (OSC 0 ... BEL), clear the screen (CSI 2J), rich markup
PAYLOAD = "\x1b]0;pwned\x07\x1b[2J[bold]x[/bold]"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J[bold]x[/bold]"

# Loaded by every python started with it on PYTHONPATH; acts only in the process of the
# role named in TRACR_TEST_RAISE ("ROLE:WHERE:TEXT"): the role's set-up (WHERE = setup)
# or its infer-dataset task (WHERE = task) raises TEXT, after writing it to stderr.
SITE = r'''
import importlib.machinery, os, sys

_role = sys.argv[sys.argv.index("--role") + 1] if "--role" in sys.argv else None
_spec = os.environ.get("TRACR_TEST_RAISE", "").split(":", 2)
_targets = {"setup": "experiment_design.roles.base", "task": "experiment_design.tasks.builtin"}

class _Raise:
    def find_spec(self, name, path=None, target=None):
        if name != _targets[_spec[1]]:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def fail(*args, **kw):
            print(_spec[2], file=sys.stderr, flush=True)
            raise RuntimeError(_spec[2])

        def exec_module(module):
            run(module)
            if _spec[1] == "setup":
                module.ParticipantService.on_setup = fail
            else:
                module.InferDataset.run = fail
        spec.loader.exec_module = exec_module
        return spec

if len(_spec) == 3 and _role == _spec[0]:
    sys.meta_path.insert(0, _Raise())
'''


@pytest.mark.slow
@pytest.mark.parametrize("where,code", [("setup", 2), ("task", 1)])
def test_a_participant_error_is_shown_escaped(tmp_path, where, code):
    """The error a participant raised (and what it wrote to stderr) is printed by
    ``tracr experiment run`` with its escape sequences visible, not obeyed: a set-up
    error ends the run through app.py's ``error:``/``hint:`` lines, a task error through
    the run's error list and the participant's log line."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    env = {**os.environ, "TRACR_TEST_RAISE": f"edge:{where}:{PAYLOAD}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(site),
                                                       os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, str(REPO / "app.py"), "experiment", "run", "alexnet-sweep",
         "--no-progress", "--out", str(tmp_path / "run"), "--set", "run.warmup=1",
         "--set", "dataset.params.limit=1", "--set", "partitioner.params.repeats=1"],
        cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    shown = proc.stdout + proc.stderr
    assert proc.returncode == code, shown
    assert "pwned" in proc.stderr, shown  # the error was printed...
    assert "\x1b" not in shown and "\x07" not in shown, shown  # ...and nothing obeyed
    assert f"RuntimeError: {SHOWN}" in proc.stderr, shown
