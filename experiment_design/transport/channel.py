"""DataChannel: one authenticated, framed TCP connection between two participants.

Every frame is sealed by the connection's :class:`~experiment_design.transport.session.Session`
(a tag over the prefix and header, checked before either is parsed, and one over the
payload; optionally encryption); a frame that fails its tag, or that no parser accepts,
closes the channel with one :class:`TransportError` that names the peer, so the stream
is never left out of step.

Tensors never go through rpyc (which copies the rest of a large message on every socket
write); they go here, as raw or blosc2-compressed buffers written with ``sendall`` on
memoryviews and read with ``recv_into`` straight into the memory the received tensor
will live in. Every time is read from this side's own clock: a transfer time that
matters is a round trip (:meth:`DataChannel.request`, :meth:`DataChannel.probe`), never
a difference between two hosts' clocks.

The channel sends and receives frames; the rest lives beside it: how a message's values
are laid out (``message.py``), the socket's receiving end (``reader.py``: read-ahead,
low-water mark, payloads that grow as they arrive), the figures a message costs
(``stats.py``) and the link's measurement (``probe.py``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import numpy as np
import torch

from experiment_design.errors import TracrError
from experiment_design.transport.codec import (
    decode_new,
    encode_tensor,
    load_blosc2,
    now_ms,
    tensor_from,
)
from experiment_design.transport.codec_config import RAW, CodecConfig
from experiment_design.transport.errors import (
    ChannelClosed,
    IntegrityError,
    ProtocolError,
    TransportError,
)
from experiment_design.transport.frame import (
    MAGIC,
    PREFIX,
    VERSION,
    Limits,
    Table,
    encode_header,
    pack_head,
    parse_caller_header,
    parse_prefix,
    parse_table,
)
from experiment_design.transport.header import check_header
from experiment_design.transport.message import PLAIN_KEY, small_raw, take_plain, with_plain
from experiment_design.transport.probe import PROBE_ACK_OP, PROBE_OP, probe_link
from experiment_design.transport.reader import SocketReader
from experiment_design.transport.session import SMALL_FRAME, TAG, Session
from experiment_design.transport.stats import RecvStats, RequestStats, SendStats

# imported from here by the package and by tests
__all__ = ["PLAIN_KEY", "PROBE_ACK_OP", "PROBE_OP", "DataChannel", "RecvStats", "RequestStats",
           "SendStats"]

log = logging.getLogger(__name__)

_CRYPT_PIECE = 1 << 20  # encrypted payloads go through the cipher in cache-sized pieces
_MAC_PIECE = 1 << 20  # and plain ones through the tag
#: every write of a large frame but its last (the tag) says more is coming (MSG_MORE), so
#: the header leaves in the payload's first segments instead of alone. Sent alone, it was
#: the one packet in flight that the kernel held the payload back for (TSO deferral waits
#: for its ACK), and the receiver delays that ACK: 90-125 ms stalls on the lab's 32 MB/s
#: link, every 6th 100 KB frame at times (the tag flushes what is held).
_MORE = getattr(socket, "MSG_MORE", 0)
_PREFIX_SIZE = PREFIX.size
_PACK = PREFIX.pack
_from_numpy = torch.from_numpy
_ndarray = np.ndarray


class DataChannel:
    """A framed, authenticated tensor connection. Build one with :class:`DataServer` or :func:`connect`.

    Sends and receives may run on two threads at once (one of each); two concurrent
    senders are serialized.

    >>> # edge side                              # cloud side
    >>> # ch = connect(host, port, secret, cfg)  # ch = server.accept()
    >>> # ch.send({"split": 4}, {"x": t})        # header, tensors, stats = ch.recv()
    """

    def __init__(
        self,
        sock: socket.socket,
        codec: CodecConfig,
        limits: Limits | None = None,
        *,
        session: Session,
    ):
        if not isinstance(session, Session):
            raise TracrError("a data channel needs the session of an authenticated handshake")
        self.session = session
        self.sock = sock
        self.codec = codec
        self.limits = limits or Limits()
        try:
            self.peer: tuple[Any, ...] = sock.getpeername()
        except OSError:
            self.peer = ("?", 0)
        if not isinstance(self.peer, tuple) or len(self.peer) < 2:  # a socketpair, say
            self.peer = (str(self.peer) or "local", 0)
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._reader = SocketReader(sock)  # used under the receive lock only
        self._last_table: tuple[bytes, Table] | None = None
        self.partner: str | None = None  # named in a receive deadline's error
        self.closed = False
        #: why this side closed the channel (a receive's error), for a send that finds it
        #: closed: another thread's send then says what closed it, not "Bad file descriptor"
        self.close_reason: str | None = None
        if codec.compresses:
            load_blosc2()  # import now, so the first measured send does not pay for it

    # -- sending ---------------------------------------------------------------------------
    def send(
        self,
        header: dict[str, Any],
        tensors: dict[str, torch.Tensor] | None = None,
        *,
        codec: CodecConfig | None = None,
    ) -> SendStats:
        """Send one message: a JSON-able ``header`` and named tensors (encoded with ``codec``
        or the channel's codec). Tensors on an accelerator are copied to the CPU first and
        that copy counts as encoding time.

        ``tensors`` may also hold plain data (ints, sizes, None, ...: ``plain.py``),
        which crosses in the header, never pickled; :meth:`recv` returns it in the same
        dict with its exact type."""
        cfg = codec or self.codec
        t0 = now_ms()
        fast = None if cfg.compresses or not tensors else small_raw(tensors)
        params = 0
        if fast is None and tensors:
            header, tensors = with_plain(header, tensors)
            if not cfg.compresses and tensors:
                fast = small_raw(tensors)
        if fast is not None:  # small raw tensors: cached table, numpy buffers, no dataclasses
            table, nbuf, payload, buffers = fast
            text = encode_header(header)
            head = _PACK(MAGIC, VERSION, 0, nbuf, len(table), len(text), payload) + table + text
            raw = payload
        elif tensors:
            encoded = [encode_tensor(name, t, cfg) for name, t in tensors.items()]
            head = pack_head(header, encoded)
            if len(encoded) == 1:
                buffers = encoded[0].buffers
                raw = encoded[0].raw_nbytes
            else:
                buffers = [b for e in encoded for b in e.buffers]
                raw = sum(e.raw_nbytes for e in encoded)
            payload = sum(map(len, buffers))
            # an image's scales, offsets and sizes ride in the table (a quantizer's scales
            # and zero points in the payload): they are part of what the cut costs
            params = sum(e.param_nbytes for e in encoded if e.lossy is not None)
        else:
            head, buffers, raw, payload = pack_head(header, ()), (), 0, 0
        t1 = now_ms()
        with self._send_lock:
            wire = self._write(head, buffers, payload)
        t2 = now_ms()
        return SendStats(raw, payload + params, t1 - t0, t2 - t1, wire)

    def send_packed(self, head: bytes, buffers: Any = ()) -> int:
        """Seal and send a frame already packed (prefix, table, header in ``head``; the
        payload in ``buffers``); returns the bytes written. :meth:`send` ends here; tools
        and tests use it to put hand-made frames on an authenticated channel."""
        buffers = list(buffers)
        with self._send_lock:
            return self._write(head, buffers, sum(memoryview(b).nbytes for b in buffers))

    def _write(self, head: bytes, buffers: Any, payload: int) -> int:
        """Seal and write one frame (the send lock is held); returns the bytes written."""
        self._check_open()
        s = self.session
        sock = self.sock
        try:
            if len(head) + payload <= SMALL_FRAME:  # one write, one tag over everything
                frame = b"".join([head, *buffers]) if buffers else head
                sealed = s.seal_head(frame, _PREFIX_SIZE)
                s.end_frame()
                sock.sendall(sealed)
                return len(sealed)
            sealed = s.seal_head(head, _PREFIX_SIZE)
            if not payload:
                s.end_frame()
                sock.sendall(sealed)
                return len(sealed)
            if s.encrypt:
                enc = s.payload_encryptor()
                sock.sendall(sealed, _MORE)
                out = memoryview(self._cipher_out())
                for buf in buffers:
                    view = memoryview(buf).cast("B")
                    for off in range(0, view.nbytes, _CRYPT_PIECE):
                        k = enc.update_into(view[off : off + _CRYPT_PIECE], out)
                        sock.sendall(out[:k], _MORE)
                enc.finalize()
                sock.sendall(enc.tag)
            else:
                mac = s.payload_mac()
                sock.sendall(sealed, _MORE)
                for buf in buffers:
                    view = memoryview(buf).cast("B")
                    # tag a piece while it is in cache, then hand it to the kernel: the
                    # receiver copies one piece while we tag the next
                    for off in range(0, view.nbytes, _MAC_PIECE):
                        piece = view[off : off + _MAC_PIECE]
                        mac.authenticate_additional_data(piece)
                        sock.sendall(piece, _MORE)
                mac.finalize()
                sock.sendall(mac.tag)
        except OSError as exc:
            if self.closed and self.close_reason:  # closed under this send by a receive
                raise ChannelClosed(self._closed_message()) from exc
            self.close()
            raise TransportError(
                f"sending to {self.peer[0]}:{self.peer[1]} failed: {exc}"
            ) from exc
        return len(sealed) + payload + TAG

    def _cipher_out(self) -> bytearray:
        out = getattr(self, "_cout", None)
        if out is None:
            out = self._cout = bytearray(_CRYPT_PIECE)
        return out

    # -- receiving -------------------------------------------------------------------------
    def recv(self) -> tuple[dict[str, Any], dict[str, torch.Tensor], RecvStats]:
        """Wait for the next message; probe messages from the peer are answered on the way.

        Raises :class:`ChannelClosed` when the peer closes between messages and
        :class:`ProtocolError` (the channel is then closed) on anything that is not a
        valid frame.
        """
        while True:
            header, tensors, stats = self.recv_frame()
            if header.get("op") == PROBE_OP:
                # the CPU this process has used: the prober charges the receiving to it
                self.send({"op": PROBE_ACK_OP, "cpu_ms": time.process_time_ns() / 1e6},
                          codec=RAW)
                continue
            return header, tensors, stats

    def recv_frame(self) -> tuple[dict[str, Any], dict[str, torch.Tensor], RecvStats]:
        """The next frame as it is, a probe included (:meth:`recv` answers those); the
        errors are :meth:`recv`'s."""
        with self._recv_lock:
            self._check_open()
            try:
                header, tensors, stats = self._read_frame()
                check_header(header)
                if PLAIN_KEY in header:
                    take_plain(header, tensors, self.limits)
                return header, tensors, stats
            except TransportError as exc:
                self.close(str(exc))
                raise
            except TimeoutError as exc:  # the deadline of set_timeout()
                who = self.partner or "the partner"
                error = TransportError(
                    f"receiving from {who} ({self.peer[0]}:{self.peer[1]}) timed out after "
                    f"{self.sock.gettimeout():g} s: {who} silent (lost)")
                self.close(str(error))
                raise error from exc
            except OSError as exc:
                error = TransportError(
                    f"receiving from {self.peer[0]}:{self.peer[1]} failed: {exc}")
                self.close(str(error))
                raise error from exc
            except Exception as exc:  # noqa: BLE001 - whatever a frame provokes, one clean error
                log.debug("malformed frame from %s", self.peer, exc_info=True)
                error = ProtocolError(
                    f"malformed frame from {self.peer[0]}:{self.peer[1]} "
                    f"({type(exc).__name__}: {exc}); the data channel is closed")
                self.close(str(error))
                raise error from None

    def _integrity(self, part: str) -> IntegrityError:
        return IntegrityError(
            f"frame {self.session.recv_seq} from {self.peer[0]}:{self.peer[1]} failed its "
            f"integrity check ({part}): altered, replayed, reordered or dropped on the way; "
            "the data channel is closed",
            hint="something on the path between the participants changes their traffic",
        )

    def _read_frame(self) -> tuple[dict[str, Any], dict[str, torch.Tensor], RecvStats]:
        r = self._reader
        start = r.ensure(_PREFIX_SIZE)
        t0 = now_ms()
        s = self.session
        nbuf, tlen, hlen, plen = parse_prefix(r.buf, self.limits, start)
        hsize = _PREFIX_SIZE + tlen + hlen
        if hsize + plen <= SMALL_FRAME:  # small frame: one tag, all of it read ahead
            size = hsize + plen + TAG
            start = r.ensure(size)
            rview = r.view
            body = s.open_head(rview[start : start + hsize + plen], _PREFIX_SIZE,
                               rview[start + hsize + plen : start + size])
            if body is None:
                raise self._integrity("frame")
            s.end_recv_frame()
            table, header = self._parse_head(body, tlen, hlen, nbuf, plen)
            r.pos = start + size
            tensors, decode_ms = self._build(table, memoryview(body)[tlen + hlen :])
            stats = RecvStats(table.raw, plen + table.params, decode_ms,
                              now_ms() - t0 - decode_ms, size, table.codec)
            return header, tensors, stats
        size = hsize + TAG + (plen + TAG if plen else 0)
        # large frame: the head through the read-ahead buffer, the payload straight into
        # the memory it will live in, growing with the bytes that arrive
        prefix = bytes(r.view[start : start + _PREFIX_SIZE])
        r.pos = start + _PREFIX_SIZE
        head = r.take(tlen + hlen)
        body = s.open_head(prefix + head, _PREFIX_SIZE, r.take(TAG))
        if body is None:
            raise self._integrity("header")
        table, header = self._parse_head(body, tlen, hlen, nbuf, plen)
        wire: list[Any] = []  # what arrived, in wire order
        if plen:
            if s.encrypt:
                dec = s.payload_decryptor()

                def absorb(piece: memoryview) -> None:
                    dec.update_into(piece, piece)  # decrypted in place, in cache
            else:
                dec = s.payload_check()
                absorb = dec.authenticate_additional_data
            for e in table.entries:
                if e.encoded_nbytes:
                    wire.append(r.read_growing(e.encoded_nbytes, absorb))
            if not s.verified(dec, r.take(TAG)):
                raise self._integrity("payload")
        else:
            s.end_recv_frame()
        tensors: dict[str, torch.Tensor] = {}
        decode_ms = 0.0
        parts = iter(wire)
        for e in table.entries:
            if e.raw_nbytes == 0:
                tensors[e.name] = tensor_from(e, None)
            elif e.codec == "none":
                tensors[e.name] = tensor_from(e, next(parts))
            else:
                src = next(parts)
                d0 = now_ms()
                buf = decode_new(e, src, self.codec.nthreads)  # checked, then allocated
                decode_ms += now_ms() - d0
                tensors[e.name] = tensor_from(e, buf)
        t1 = now_ms()
        stats = RecvStats(table.raw, plen + table.params, decode_ms, (t1 - t0) - decode_ms, size,
                          table.codec)
        return header, tensors, stats

    def _parse_head(
        self, body: bytes, tlen: int, hlen: int, nbuf: int, plen: int
    ) -> tuple[Table, dict]:
        """The verified head's table (cached for a repeated split) and caller header."""
        last = self._last_table
        if last is not None and len(last[0]) == tlen and body.startswith(last[0]):
            table = last[1]  # the same split as last time: already validated
            if table.chunks != nbuf or table.encoded != plen:
                raise ProtocolError("frame table and prefix disagree on the payload")
        else:
            text = body[:tlen]
            table = parse_table(text, nbuf, plen, self.limits)
            self._last_table = (text, table)
        return table, parse_caller_header(body[tlen : tlen + hlen])

    def _build(self, table: Table, data: memoryview) -> tuple[dict[str, torch.Tensor], float]:
        """Tensors of a small frame from its verified, cleartext payload (each owns a copy)."""
        tensors: dict[str, torch.Tensor] = {}
        plan = table.plan
        pos = 0
        if plan is not None:
            for name, n, npdtype, shape in plan:
                tensors[name] = _from_numpy(_ndarray(shape, npdtype, bytearray(data[pos : pos + n])))
                pos += n
            return tensors, 0.0
        decode_ms = 0.0
        for e in table.entries:
            n = e.raw_nbytes
            if n == 0:
                tensors[e.name] = tensor_from(e, None)
            elif e.codec == "none":
                tensors[e.name] = tensor_from(e, bytearray(data[pos : pos + n]))
            else:
                d0 = now_ms()
                buf = decode_new(e, data[pos : pos + e.encoded_nbytes], self.codec.nthreads)
                decode_ms += now_ms() - d0
                tensors[e.name] = tensor_from(e, buf)
            pos += e.encoded_nbytes
        return tensors, decode_ms

    # -- round trips -----------------------------------------------------------------------
    def request(
        self,
        header: dict[str, Any],
        tensors: dict[str, torch.Tensor] | None = None,
        *,
        codec: CodecConfig | None = None,
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor], RequestStats]:
        """Send a message and wait for the peer's reply; the round trip is timed here only."""
        t0 = now_ms()
        sstats = self.send(header, tensors, codec=codec)
        rheader, rtensors, rstats = self.recv()
        total = now_ms() - t0
        rtt = total - sstats.encode_ms - rstats.decode_ms
        return rheader, rtensors, RequestStats(sstats, rstats, rtt)

    def probe(self, sizes: tuple[int, ...] = (65536, 1048576), rounds: int = 3) -> dict[str, Any]:
        """Measure the link to the peer on this side's clock (the peer must be in
        :meth:`recv`): rtt, bandwidth and the CPU a byte costs either end; see
        :func:`~experiment_design.transport.probe.probe_link`."""
        return probe_link(self, sizes, rounds)

    def set_timeout(self, seconds: float | None, partner: str | None = None) -> None:
        """Bound every later socket wait (None: wait forever, the default after the handshake).

        A timeout in the middle of a frame leaves the stream out of step, so the channel is
        closed when one fires; use it to notice a partner that went silent, not to poll.
        ``partner`` (its instance name) is named in the error a receive deadline raises.
        """
        self.sock.settimeout(seconds)
        if partner is not None:
            self.partner = partner

    # -- lifetime --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ChannelClosed(self._closed_message())

    def _closed_message(self) -> str:
        if self.close_reason:
            return f"the data channel was closed: {self.close_reason}"
        return "the data channel is closed"

    def close(self, reason: str | None = None) -> None:
        """Close the connection (idempotent); ``reason``: the error that closed it."""
        if self.closed:
            return
        self.close_reason = reason
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> DataChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<DataChannel {self.peer[0]}:{self.peer[1]} {self.codec.codec} {state}>"
