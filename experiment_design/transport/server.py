"""Accepting data channels: :class:`DataServer` on the receiving participant (the sender's
side is :func:`experiment_design.transport.client.connect`)."""

from __future__ import annotations

import ipaddress
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Iterable
from typing import NamedTuple

from experiment_design.transport import auth
from experiment_design.transport.channel import DataChannel
from experiment_design.transport.client import tune
from experiment_design.transport.codec import CodecConfig, load_blosc2
from experiment_design.transport.errors import AuthError, TransportError
from experiment_design.transport.frame import Limits

log = logging.getLogger(__name__)

_ACCEPT_BATCH = 16  # connections taken from the backlog per turn of the loop
_TICK_S = 0.25  # the loop looks at deadlines at least this often
_KEYS_KEPT = 64  # link keys remembered by a server that derives them from the run's secret


def _plain_ip(host: str) -> str:
    """``host`` as a source address reads: an IPv4 address mapped into IPv6 unmapped."""
    if host.startswith("::ffff:") and "." in host:
        return host[7:]
    return host


class Partner(NamedTuple):
    """A participant a :class:`DataServer` admits: its name, its link's key
    (:func:`~experiment_design.transport.auth.link_key`) and the addresses it connects
    from (IP literals; empty: from anywhere)."""

    name: str
    key: bytes
    hosts: tuple[str, ...] = ()


class _Pending:
    """A connection in its handshake: what it has said so far and by when it must finish."""

    __slots__ = ("sock", "source", "port", "seq", "deadline", "hello", "buf", "need")

    def __init__(self, sock: socket.socket, addr: tuple, seq: int, deadline: float,
                 hello: bytes) -> None:
        self.sock, self.source, self.port = sock, _plain_ip(addr[0]), addr[1]
        self.seq, self.deadline, self.hello = seq, deadline, hello
        self.buf = b""
        self.need = auth.REPLY_HEAD  # bytes of the reply known to be due so far


class DataServer:
    """Listens for partners' data channels; only admitted partners, proving their link's
    key, get through.

    Whom it admits: with ``secret`` (the run's secret: tools and tests), any peer that
    names itself and proves the key derived for that name; with ``secret=None``, nobody
    until :meth:`admit` names the partners the observer wired to this participant, with
    their keys and the addresses they connect from. Once partners are admitted, a
    connection from any other address is closed as soon as it is accepted, a partner's
    name is taken once, and the server stops listening when every admitted partner has
    connected: during the run the port is closed.

    Handshakes cost no thread: one event loop (``selectors``) accepts connections and
    drives every handshake, each against one deadline for the whole exchange
    (``handshake_timeout``), so a peer that stalls or trickles bytes holds one file
    descriptor and a few hundred bytes until then. At most ``max_pending_per_source``
    handshakes run per source address and ``max_pending`` in all; past either, the new
    connection takes the place of the one that has said least (the oldest of those), so a
    crowd of silent connections cannot keep a partner out, and one address cannot take
    the places of the others. A peer that fails the handshake, sends garbage or misses
    the deadline is logged and dropped.

    >>> # server = DataServer("127.0.0.1", 0, None, CodecConfig(), name="cloud")
    >>> # port = server.address[1]          # tell the observer (setup's reply)
    >>> # server.admit([Partner("edge", key, ("10.0.0.2",))])   # from the observer
    >>> # channel = server.accept(timeout=30)
    """

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes | None,
        codec: CodecConfig,
        *,
        name: str = "server",
        handshake_timeout: float = 5.0,
        limits: Limits | None = None,
        backlog: int = 128,
        max_pending: int = 256,
        max_pending_per_source: int = 64,
    ) -> None:
        self.secret = auth.check_secret(secret) if secret is not None else None
        auth.link_key(bytes(16), name, "x")  # a bad name fails here, not in every handshake
        self.name = name
        self.codec = codec
        self.limits = limits or Limits()
        self.handshake_timeout = handshake_timeout
        self.max_pending = max_pending
        self.max_pending_per_source = max_pending_per_source
        if codec.compresses:
            load_blosc2()  # imported here, not in the event loop at the first partner
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._sock = socket.create_server((host, port), family=family, backlog=backlog)
        except OSError as exc:
            raise TransportError(
                f"cannot listen for data channels on {host}:{port}: {exc}",
                hint="use port 0 to let the system choose a free port",
            ) from None
        self._sock.setblocking(False)
        self._address = self._sock.getsockname()[:2]
        self.rejected = 0  # peers dropped so far (failed auth, garbage, stalled, displaced)
        self.complete = False  # every admitted partner has connected: no longer listening
        self._partners: dict[str, Partner] | None = None
        self._connected: set[str] = set()
        self._keys: dict[str, bytes] = {}
        self._pending: dict[socket.socket, _Pending] = {}
        self._seq = 0
        self._lock = threading.Lock()
        self._ready: queue.Queue[DataChannel | None] = queue.Queue()
        self._closed = False
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._loop_thread = threading.Thread(target=self._loop, name="data-accept", daemon=True)
        self._loop_thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the port is the real one when 0 was asked for."""
        return self._address[0], self._address[1]

    @property
    def pending(self) -> int:
        """Connections in their handshake now."""
        return len(self._pending)

    # -- whom it admits --------------------------------------------------------------------
    def admit(self, partners: Iterable[Partner]) -> None:
        """Admit these partners, and only them from now on (a host name among their
        addresses is resolved here, once)."""
        table = {}
        for p in partners:
            auth.link_key(bytes(16), self.name, p.name)  # the name is sayable
            hosts = tuple(sorted({a for h in p.hosts for a in _addresses(h)}))
            table[p.name] = Partner(p.name, auth.check_secret(p.key), hosts)
        with self._lock:
            self._partners = table
            done = set(table) <= self._connected
        log.info("data server %s admits %s", self.name,
                 ", ".join(f"{p.name} from {'/'.join(p.hosts) or 'anywhere'}"
                           for p in table.values()) or "nobody")
        if done:
            self._finish()

    def _source_ok(self, source: str) -> bool:
        with self._lock:
            partners = self._partners
            if partners is None:
                return self.secret is not None
            return any(not p.hosts or source in p.hosts for p in partners.values()
                       if p.name not in self._connected)

    def _key_for(self, name: str, source: str) -> bytes:
        with self._lock:
            partners = self._partners
            if partners is None:
                if self.secret is None:
                    raise AuthError("no partner is admitted yet")
                key = self._keys.get(name)
                if key is None:
                    key = auth.link_key(self.secret, self.name, name)
                    if len(self._keys) < _KEYS_KEPT:  # names are the peer's to choose
                        self._keys[name] = key
                return key
            p = partners.get(name)
            if p is None:
                raise AuthError(f"{name!r} is not a partner of {self.name!r}")
            if name in self._connected:
                raise AuthError(f"{name!r} is connected already")
            if p.hosts and source not in p.hosts:
                raise AuthError(f"{name!r} connects from {'/'.join(p.hosts)}, not {source}")
            return p.key

    # -- the event loop ----------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._closed:
                now = time.monotonic()
                first = min((p.deadline for p in self._pending.values()), default=now + _TICK_S)
                for key, _ in self._sel.select(max(0.0, min(first - now, _TICK_S))):
                    if key.data is None:
                        self._accept_some()
                    elif key.data == "wake":
                        self._drain_wake()
                    elif key.fileobj in self._pending:
                        self._advance(key.data)
                now = time.monotonic()
                for p in [p for p in self._pending.values() if p.deadline <= now]:
                    self._drop(p, f"handshake not finished in {self.handshake_timeout:g} s")
                if self.complete:  # whoever is still in a handshake is not a partner
                    break
        finally:
            for p in list(self._pending.values()):
                self._drop(p, "the data server stopped")
            self._unlisten()
            self._sel.close()
            self._wake_r.close()
            self._ready.put(None)  # wakes a waiting accept()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except OSError:
            pass

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def _accept_some(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors, say: try again next turn
                log.warning("data server %s cannot accept: %s", self.name, exc)
                time.sleep(0.05)
                return
            self._admit_connection(conn, addr)

    def _admit_connection(self, conn: socket.socket, addr: tuple) -> None:
        source = _plain_ip(addr[0])
        if self.complete or not self._source_ok(source):
            self.rejected += 1
            log.info("refused a data connection from %s:%s (not an expected partner's "
                     "address)", source, addr[1])
            conn.close()
            return
        same = [p for p in self._pending.values() if p.source == source]
        if len(same) >= self.max_pending_per_source:
            self._displace(same, f"{len(same)} handshakes pending from {source}")
        elif len(self._pending) >= self.max_pending:
            self._displace(list(self._pending.values()),
                           f"{len(self._pending)} handshakes pending")
        try:
            conn.setblocking(False)
            tune(conn)
            hello, _ = auth.server_hello(self.name, self.codec.encrypt)
            if conn.send(hello) != len(hello):  # a fresh socket takes 300 bytes at once
                raise OSError("the greeting did not fit the send buffer")
        except OSError as exc:
            self.rejected += 1
            log.info("dropped data-channel peer %s:%s: %s", source, addr[1], exc)
            conn.close()
            return
        self._seq += 1
        p = _Pending(conn, addr, self._seq, time.monotonic() + self.handshake_timeout, hello)
        self._pending[conn] = p
        self._sel.register(conn, selectors.EVENT_READ, p)

    def _displace(self, among: list[_Pending], why: str) -> None:
        """Drop the connection of ``among`` that has said least, the oldest of those."""
        victim = min(among, key=lambda p: (len(p.buf), p.seq))
        self._drop(victim, f"displaced by a newer connection ({why})")

    def _drop(self, p: _Pending, why: object) -> None:
        if self._pending.pop(p.sock, None) is None:
            return
        self.rejected += 1
        log.warning("dropped data-channel peer %s:%s: %s", p.source, p.port, why or "closed")
        try:
            self._sel.unregister(p.sock)
        except (KeyError, ValueError):
            pass
        p.sock.close()

    def _advance(self, p: _Pending) -> None:
        """Read what is due of ``p``'s reply; finish the handshake once it is all in."""
        try:
            data = p.sock.recv(p.need - len(p.buf))  # never past the reply: frames follow
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(p, exc)
            return
        if not data:
            self._drop(p, f"closed after {len(p.buf)} bytes of its reply")
            return
        p.buf += data
        try:
            if len(p.buf) == auth.REPLY_HEAD and p.need == auth.REPLY_HEAD:
                p.need += auth.reply_name_length(p.buf) + auth.DIGEST
            if len(p.buf) < p.need:
                return
            name = auth.decode_name(p.buf[auth.REPLY_HEAD : -auth.DIGEST])
            key = self._key_for(name, p.source)
            answer = auth.check_reply(key, p.hello, p.buf, self.codec.encrypt)
            if p.sock.send(answer) != len(answer):
                raise OSError("the answer did not fit the send buffer")
        except (TransportError, OSError) as exc:
            self._drop(p, exc)
            return
        del self._pending[p.sock]
        self._sel.unregister(p.sock)
        p.sock.setblocking(True)
        p.sock.settimeout(None)
        session = auth.server_session(key, p.hello, p.buf, self.codec.encrypt)
        channel = DataChannel(p.sock, self.codec, self.limits, session=session)
        channel.partner = name
        log.debug("data channel from %s (%s:%s) authenticated", name, p.source, p.port)
        with self._lock:
            self._connected.add(name)
            partners = self._partners
            done = partners is not None and set(partners) <= self._connected
        if done:  # the port is closed before anyone is handed the last partner's channel
            self._finish()
            self._unlisten()
        self._ready.put(channel)

    def _finish(self) -> None:
        """Every admitted partner has connected: stop listening, drop whoever is still in
        a handshake (the loop does it and ends)."""
        with self._lock:
            if self.complete:
                return
            self.complete = True
        log.info("data server %s: every partner connected; no longer listening", self.name)
        self._wake()

    def _unlisten(self) -> None:
        try:
            self._sel.unregister(self._sock)
        except (KeyError, ValueError):
            pass
        try:
            self._sock.close()
        except OSError:
            pass

    # -- handing channels out ------------------------------------------------------------------
    def accept(self, timeout: float | None = None) -> DataChannel:
        """Wait for the next authenticated peer (``timeout`` seconds in all, None = forever)."""
        if self._closed:
            raise TransportError("the data server stopped accepting: it is closed")
        try:
            channel = self._ready.get(timeout=timeout)
        except queue.Empty:
            raise TransportError(
                f"no authenticated data channel within {timeout:.1f} s on port {self.address[1]}",
                hint="check that the partner can reach this address and belongs to this run",
            ) from None
        if channel is None:
            self._ready.put(None)  # for any other waiter
            if self.complete and not self._closed:
                raise TransportError("the data server stopped accepting: every admitted "
                                     "partner has connected")
            raise TransportError("the data server stopped accepting: it is closed")
        return channel

    def close(self) -> None:
        """Stop listening (channels already accepted stay open); a blocked :meth:`accept` returns."""
        with self._lock:
            self._closed = True
        self._wake()
        self._loop_thread.join(5.0)
        try:
            self._wake_w.close()
        except OSError:
            pass
        self._ready.put(None)
        while True:  # authenticated but never accepted: ours to close
            try:
                channel = self._ready.get_nowait()
            except queue.Empty:
                break
            if channel is not None:
                channel.close()
        self._ready.put(None)

    def __enter__(self) -> DataServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _addresses(host: str, timeout: float = 5.0) -> list[str]:
    """``host``'s IP addresses: itself when it is one, else what the resolver says within
    ``timeout`` (a name that does not resolve admits nobody, and says so)."""
    try:
        return [str(ipaddress.ip_address(_plain_ip(host)))]
    except ValueError:
        pass
    found: list[str] = []

    def resolve() -> None:
        try:
            found.extend(_plain_ip(str(info[4][0])) for info in socket.getaddrinfo(host, None))
        except OSError:
            pass

    t = threading.Thread(target=resolve, name="data-resolve", daemon=True)
    t.start()
    t.join(timeout)
    if not found:
        log.warning("partner address %r does not resolve: no connection from it is admitted",
                    host)
    return sorted(set(found))
