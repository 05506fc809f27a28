"""The progress view's log rendering: participant text never drives the observer's terminal."""

from __future__ import annotations

import io
import logging
import unicodedata

import pytest
from rich.console import Console

from app_api.runner.progress import ProgressView, printable
from experiment_design.protocol import PollReply
from experiment_design.runtime.logcapture import LogBuffer

# What a hostile or careless participant may log: clear the screen, recolour, retitle the
# window (OSC 0), write the clipboard (OSC 52), a one-byte C1 CSI, a carriage return that
# overwrites the line, a backspace, a bidi override, and a fake line from another participant.
HOSTILE = (
    "loss \x1b[2J\x1b[31mred\x1b]0;owned\x07 clip\x1b]52;c;ZWNobyBoaQ==\x1b\\ "
    "\x9b1m c1 \rgone\x08 \u202etxt.exe tab\there done"
    "\n[cloud-1@10.0.0.9] fake line"
)


def _records_as_the_observer_gets_them(msg: str, level: int = logging.INFO) -> list[dict]:
    """A real log call in a participant, captured and sent in a poll reply, decoded."""
    logger = logging.getLogger("tracr.test.hostile")
    buf = LogBuffer()
    logger.addHandler(buf)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        logger.log(level, "%s", msg)
    finally:
        logger.removeHandler(buf)
    wire = PollReply(state="running", logs=buf.drain()).to_json()
    return PollReply.from_json(wire).logs


def _controls(text: str) -> set[str]:
    return {ch for ch in text if unicodedata.category(ch) in ("Cc", "Cf") and ch not in "\t\n"}


def test_log_lines_on_the_terminal_carry_no_escape_sequences():
    # Before: ESC, BEL, C1 CSI and the bidi override reached the terminal as they were.
    view = ProgressView(enabled=True)
    out = io.StringIO()
    # A terminal without colours: whatever control character is left came from the participant.
    view.console = Console(file=out, force_terminal=True, color_system=None, width=400)
    for rec in _records_as_the_observer_gets_them(HOSTILE):
        view.log("edge-1", "10.0.0.7", rec)
    shown = out.getvalue()
    assert _controls(shown) == set(), shown
    # still readable, with the escapes shown as text
    assert "[edge-1@10.0.0.7] loss \\x1b[2J\\x1b[31mred\\x1b]0;owned\\x07 clip" in shown
    assert "\\x9b1m c1 \\rgone\\x08 \\u202etxt.exe" in shown and "here done" in shown
    # the second line is indented under its own tag, not a line of its own
    lines = shown.splitlines()
    assert lines[0].startswith("[edge-1@10.0.0.7]")
    assert lines[1] == "    [cloud-1@10.0.0.9] fake line"


def test_quiet_view_escapes_warnings_it_prints(capsys):
    view = ProgressView(enabled=False)
    for rec in _records_as_the_observer_gets_them(HOSTILE, logging.WARNING):
        view.log("edge-1", "pi\x1b[8m", rec)
    err = capsys.readouterr().err
    assert _controls(err) == set(), err
    assert err.startswith("[edge-1@pi\\x1b[8m] WARNING loss \\x1b[2J")


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("plain text: 12:30 é 中文 🙂", "plain text: 12:30 é 中文 🙂"),
        ("a\x00b\x7fc\x85d", "a\\x00b\\x7fc\\x85d"),
        ("ok\r\n", "ok\\r\n"),
        ("x\u2028y\u2066z", "x\\u2028y\\u2066z"),
    ],
)
def test_printable_escapes_controls_and_keeps_text(raw, shown):
    assert printable(raw) == shown
