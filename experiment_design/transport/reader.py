"""SocketReader: the receiving end of a data channel's socket.

Small reads (a frame's prefix, header and tags; a whole small frame) go through a
read-ahead buffer, so a small frame that arrived in one segment is taken with one
``recv``. A large payload is read straight into memory of its own, which grows as the
bytes arrive (a declared size is a promise, not bytes), and each piece goes through the
frame's tag or cipher while it is in cache. A large read raises the socket's low-water
mark so that the kernel wakes the reader once per mark, not at every burst of segments.
"""

from __future__ import annotations

import fcntl
import select
import socket
import sys
import termios
from typing import Any

import numpy as np

from experiment_design.transport.errors import ChannelClosed

_WAITALL = getattr(socket, "MSG_WAITALL", 0)
# A declared size is a promise, not bytes: buffers above this grow as the bytes arrive,
# so a peer that declares 2 GiB and sends nothing costs at most this much memory.
_GROW = 64 << 20
_PIECE = 1 << 20  # a payload is read, and tagged or decrypted, in cache-sized pieces
_READ_AHEAD = 256 * 1024
#: a read of at least _LOW_MIN bytes asks the kernel to wake it only once up to _LOW_MAX
#: bytes are queued (SO_RCVLOWAT). Woken at every burst instead, a receiver on a shaped
#: lab link spent 2.66 ms of CPU per MB (600 KB frames at 30.7 MB/s); with the mark at the
#: frame's size, 0.46 ms/MB. The cap bounds how long one wait can take on a slow link.
_LOW_MIN = 64 * 1024
_LOW_MAX = 1 << 20


class SocketReader:
    """Reads a socket's stream for one receiving thread (the channel's receive lock).

    ``buf[pos:end]`` holds bytes read ahead and not taken yet; :meth:`ensure` makes ``n``
    of them available there, :meth:`take` copies them out, :meth:`read_into` and
    :meth:`read_growing` fill memory of the caller's or of their own.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        # Read-ahead buffer: a small frame (prefix, header and payload) usually arrives in
        # one segment and is then taken with one recv instead of three.
        self.buf = bytearray(_READ_AHEAD)
        self.view = memoryview(self.buf)
        self.pos = self.end = 0
        self._poll: Any = None  # a poll object on the socket, made by the first large read
        self._low_water_ok = True

    def ensure(self, n: int) -> int:
        """Make at least ``n`` (<= half the read-ahead buffer) bytes available in ``buf``;
        returns where they start (``pos``)."""
        if self.end - self.pos < n:
            self._fill(n)
        return self.pos

    def read_growing(self, n: int, absorb: Any) -> Any:
        """``n`` bytes of the stream in a buffer of their own that grows as they arrive;
        each piece goes through ``absorb`` (tag or decrypt) as soon as it is in."""
        size = min(n, _GROW)
        # Every byte is about to be overwritten: no zero-filling (bytearray(n) would).
        buf: Any = np.empty(n, np.uint8) if n <= _GROW else bytearray(size)
        got = 0
        while True:
            with memoryview(buf) as view:
                while got < size:
                    k = min(_PIECE, size - got)
                    piece = view[got : got + k]
                    self.read_into(piece, k)
                    absorb(piece)
                    piece.release()
                    got += k
            if got == n:
                return buf
            more = min(size, n - size)  # doubling: each byte is copied at most once more
            buf += bytes(more)
            size += more

    def _fill(self, n: int) -> None:
        """Make at least ``n`` (<= half the read-ahead buffer) bytes available in it."""
        if self.pos == self.end:
            self.pos = self.end = 0
        elif self.pos + n > len(self.buf):  # not enough room left: move the tail to the front
            tail = self.end - self.pos
            self.view[:tail] = self.view[self.pos : self.end]
            self.pos, self.end = 0, tail
        while self.end - self.pos < n:
            k = self.sock.recv_into(self.view[self.end :])
            if k == 0:
                if self.end == self.pos:
                    raise ChannelClosed("the peer closed the data channel")
                raise ChannelClosed("peer closed the connection in the middle of a frame")
            self.end += k

    def take(self, n: int) -> bytes:
        """``n`` bytes of the stream, through the read-ahead buffer."""
        if n > len(self.buf) // 2:
            out = bytearray(n)
            self.read_into(memoryview(out), n)
            return bytes(out)
        if self.end - self.pos < n:
            self._fill(n)
        pos = self.pos
        self.pos = pos + n
        return bytes(self.view[pos : pos + n])

    def read_into(self, view: memoryview, n: int) -> None:
        """Fill ``view[:n]``: first from the read-ahead buffer, then straight from the socket.

        A large read raises the socket's low-water mark (``SO_RCVLOWAT``, see
        :func:`_low_water`) and waits in ``poll`` until that much is queued, then copies
        all of it at once: the kernel wakes this thread once per mark instead of at every
        burst of segments. The wait is in ``poll`` rather than in a blocking ``recv``,
        which, once it had copied part of the data, could wait for a mark the rest of the
        frame never reaches.
        """
        got = min(n, self.end - self.pos)
        if got:
            view[:got] = self.view[self.pos : self.pos + got]
            self.pos += got
        if self.pos == self.end:
            self.pos = self.end = 0
        raised = False
        try:
            while got < n:
                low = _low_water(n - got) if self._low_water_ok else 0
                if low and self._set_low_water(low):
                    raised = True
                    self._wait_queued()
                    flags = socket.MSG_DONTWAIT
                else:
                    if raised:
                        self._set_low_water(1)
                        raised = False
                    flags = _WAITALL
                try:
                    k = self.sock.recv_into(view[got:], n - got, flags)
                except BlockingIOError:  # woken with nothing to read: wait again
                    continue
                if k == 0:
                    raise ChannelClosed(
                        f"peer closed the connection in the middle of a frame ({got}/{n} bytes)"
                    )
                got += k
        finally:
            if raised:
                self._set_low_water(1)

    def _set_low_water(self, nbytes: int) -> bool:
        """Set the socket's low-water mark; False (and never again) where it has none."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
            return True
        except OSError:
            self._low_water_ok = False
            return False

    def _wait_queued(self) -> None:
        """Wait until the low-water mark is queued (or the peer closed), within the
        socket's timeout. The deadline counts silence: if the time runs out with fewer
        bytes queued, those bytes are progress and return at once; none at all is a
        silent peer (``TimeoutError``)."""
        timeout = self.sock.gettimeout()
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.sock.fileno(), select.POLLIN | select.POLLPRI)
        if self._poll.poll(None if timeout is None else timeout * 1000.0):
            return
        if not _queued(self.sock):
            raise TimeoutError("timed out")
        self._set_low_water(1)


def _low_water(missing: int) -> int:
    """The low-water mark for a read that still misses ``missing`` bytes (0: leave it)."""
    return min(missing, _LOW_MAX) if missing >= _LOW_MIN else 0


def _queued(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive queue (0 where that cannot be read)."""
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int.from_bytes(buf, sys.byteorder)
