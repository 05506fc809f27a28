"""Text that came from a participant or a device, made safe to show on the terminal.

Every piece of it (a remote error, a task's error, a stderr tail, a log line, what a
device reports) goes through :func:`printable` wherever it is printed: shown, never
obeyed. A participant cannot retitle the window (OSC ``ESC ] 0 ; ... BEL``), clear the
screen or move the cursor (CSI ``ESC [ ...``), overwrite a line (CR), reorder what is
shown (bidi overrides), nor, where rich renders the text, restyle it with markup.
"""

from __future__ import annotations

import re

# What a participant's text must not carry to the observer's terminal: C0 controls but
# tab and newline (ESC starts CSI/OSC sequences that recolour, move the cursor, retitle
# the window or write the clipboard; BEL ends an OSC; CR overwrites the line), DEL, C1
# controls (0x9b is a one-byte CSI, 0x9d a one-byte OSC), the bidi overrides that reorder
# what is shown, line/paragraph separators.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED = {"\r": "\\r", "\x1b": "\\x1b"}


def _escaped(m: re.Match) -> str:
    ch = m.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, markup: bool = False) -> str:
    """``text`` with every control character and escape sequence shown escaped, not obeyed.

    ``"\\x1b]0;pwned\\x07\\x1b[2J"`` (retitle the window, clear the screen) becomes the
    readable ``\\x1b]0;pwned\\x07\\x1b[2J``; tabs, newlines and all other text (accents,
    CJK, emoji) stay as they are. With ``markup`` (text that rich renders: a table cell,
    ``console.print``) rich's markup is escaped too, so ``[bold]x[/bold]`` is shown as
    written.
    """
    out = _UNSAFE.sub(_escaped, str(text))
    if markup:
        from rich.markup import escape

        out = escape(out)
    return out
