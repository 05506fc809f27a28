"""The cloud role: a data server that runs the layers after the cut and replies."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from experiment_design.protocol import DataAddress
from experiment_design.roles.base import ParticipantService
from experiment_design.roles.registry import register_role

log = logging.getLogger(__name__)


@register_role("cloud")
class CloudRole(ParticipantService):
    """Accepts authenticated data channels, runs suffixes, returns the (small) result.

    The reply header carries the cloud's own durations (decode_ms, compute_ms,
    per-layer ms), each measured on this host's clock.
    """

    partners: dict[str, str] = {}
    side = "suffix"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.server: Any = None
        self._open = 0
        self._served = 0
        self._channels: list[Any] = []

    def on_setup(self, config: dict) -> dict:
        """Model plus a listening DataServer (bind host from ``data_bind``)."""
        info = super().on_setup(config)
        from experiment_design.transport import DataServer

        bind = config.get("data_bind") or "127.0.0.1"
        self.server = DataServer(bind, int(config.get("data_port") or 0), self.data_secret,
                                 self.codec)
        threading.Thread(target=self._accept_loop, name="data-accept", daemon=True).start()
        info["data_address"] = list(self.server.address)
        return info

    def data_address(self) -> DataAddress | None:
        """Where partners connect: ``{"host", "port"}``."""
        if self.server is None:
            return None
        host, port = self.server.address[:2]
        return DataAddress(host=host, port=port)

    def _accept_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                ch = self.server.accept(timeout=None)
            except Exception as exc:  # closed server, or a peer that failed auth
                if self.stop_event.is_set():
                    return
                log.warning("data accept: %s", exc)
                time.sleep(0.05)
                continue
            if ch is None:
                continue
            with self._lock:
                self._open += 1
                self._channels.append(ch)
            threading.Thread(target=self._serve, args=(ch,), name="data-serve", daemon=True).start()

    def _serve(self, ch: Any) -> None:
        import torch

        from experiment_design.split import flatten_output
        from experiment_design.transport.errors import TransportError

        sm = self.split_model
        try:
            while not self.stop_event.is_set():
                header, tensors, rstats = ch.recv()
                op = header.get("op")
                if op == "finish":
                    ch.send({"op": "bye"}, {})
                    break
                if op == "echo":
                    ch.send({"op": "echo"}, tensors)
                    continue
                reply: dict[str, Any] = {"op": "result", "id": header.get("id"),
                                         "decode_ms": rstats.decode_ms}
                try:
                    if str(self.device) != "cpu":
                        # the copy to the accelerator is part of getting the input ready: decode
                        d0 = time.perf_counter_ns()
                        tensors = {k: v.to(self.device) for k, v in tensors.items()}
                        torch.cuda.synchronize(self.device)
                        reply["decode_ms"] += (time.perf_counter_ns() - d0) / 1e6
                    with torch.inference_mode():
                        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
                        out, layers = sm.run_suffix(int(header["split"]), tensors, timed=True)
                        t1, c1 = time.perf_counter_ns(), time.process_time_ns()
                    outs = {f"out{i}": t for i, t in enumerate(flatten_output(out))}
                    reply.update(compute_ms=(t1 - t0) / 1e6, cpu_ms=(c1 - c0) / 1e6,
                                 layers=[[int(i), float(ms)] for i, ms in layers])
                except Exception as exc:  # reported in the reply, the edge records it
                    log.error("inference %s at split %s failed: %s", header.get("id"),
                              header.get("split"), exc)
                    reply["error"] = f"{type(exc).__name__}: {exc}"
                    outs = {}
                ch.send(reply, outs)
                self._served += 1
        except (OSError, EOFError, TransportError) as exc:
            if not self.stop_event.is_set():
                log.info("data channel closed: %s", exc)
        finally:
            ch.close()
            with self._lock:
                self._open -= 1
                if ch in self._channels:
                    self._channels.remove(ch)
                last = self._open <= 0
            if last:
                self.finish_event.set()

    def close(self) -> None:
        """Stop accepting and close the server socket."""
        super().close()
        if self.server is not None:
            try:
                self.server.close()
            except OSError:
                pass
        for ch in list(self._channels):
            ch.close()
