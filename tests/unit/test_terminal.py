"""Participant text on the observer's terminal: shown escaped, never obeyed."""

from __future__ import annotations

import io
import logging

from app_api.results.summary import build_summary
from app_api.terminal import printable

#: retitle the window (OSC 0 ... BEL), clear the screen (CSI 2J), rich markup
PAYLOAD = "\x1b]0;pwned\x07\x1b[2J[bold]x[/bold]"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J[bold]x[/bold]"


def obeyed(text: str) -> bool:
    """Whether ``text`` carries anything a terminal acts on (ESC, BEL, C1 CSI/OSC)."""
    return any(c in text for c in "\x1b\x07\x9b\x9d")


def test_printable_shows_escapes_and_markup_as_written():
    from rich.console import Console

    assert printable(PAYLOAD) == SHOWN
    assert printable("accents é, 中文, tab\tand\nnewline") == "accents é, 中文, tab\tand\nnewline"
    assert printable("\x9b2J\x9d0;t\x07\r") == "\\x9b2J\\x9d0;t\\x07\\r"
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    console.print(printable(PAYLOAD, markup=True), highlight=False)
    # as written, and not even a style: the markup was not applied
    assert console.file.getvalue() == SHOWN + "\n"


def test_results_show_prints_a_participant_error_escaped(capsys):
    from app_api.cli.results import print_group, print_summary

    s = build_summary([], experiment="x", run_id="r1")
    s["partitioners"] = {"neurosurgeon": {"error": f"edge-1: {PAYLOAD}"}}
    s["incomplete"] = {"reason": f"cloud-1: {PAYLOAD}", "rows": 0}
    print_summary(s, "r")
    print_group({"experiment": "x", "group_id": "g", "rows": [],
                 "errors": [f"rate 1MB/s: edge-1: {PAYLOAD}"]}, "g")
    out = capsys.readouterr().out
    assert not obeyed(out), out
    assert out.count("[bold]x[/bold]") == 3, out  # markup shown as written, never applied
    assert out.count("\\x1b]0;pwned\\x07\\x1b[2J") == 3, out


def test_log_lines_on_the_observer_are_escaped():
    import app

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.addFilter(app._shown)
    log = logging.getLogger("tracr-test-terminal")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("partitioner %s could not decide: %s", "x", PAYLOAD)
    finally:
        log.removeHandler(handler)
    assert not obeyed(buf.getvalue())
    assert buf.getvalue() == f"partitioner x could not decide: {SHOWN}\n"
