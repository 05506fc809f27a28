"""The edge role: preloaded inputs, layers before the cut, send, receive the result."""

from __future__ import annotations

import logging
import time
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.partitioners import PartitionContext, create_partitioner
from experiment_design.protocol import (
    LIVENESS_TIMEOUT_S,
    InferenceRecord,
    LayerRecord,
    Measurements,
    PartitionerPlan,
    partition_context,
)
from experiment_design.roles.base import ParticipantService
from experiment_design.roles.registry import register_role

log = logging.getLogger(__name__)


@register_role("edge")
class EdgeRole(ParticipantService):
    """Runs the layers before the cut on its own inputs and ships the crossing tensors.

    One row per inference, all durations on this host's clock except the
    cloud's own decode/compute durations, which it measures and reports.
    """

    partners = {"downstream": "cloud"}
    needs_dataset = True
    side = "prefix"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.channels: list[tuple[str, Any]] = []
        self.partitioner: Any = None
        self._next_id = 0
        self._rr = 0

    def on_setup(self, config: dict) -> dict:
        """Model, dataset and the partitioner (set up later, with its context)."""
        info = super().on_setup(config)
        p = config.get("partitioner") or {"name": "cyclic", "params": {}}
        self.partitioner = create_partitioner(p["name"], **(p.get("params") or {}))
        info["partitioner_needs"] = sorted(self.partitioner.needs)
        self.weights = "pretrained" if config["model"].get("weights") else "random"
        return info

    def on_connect_partners(self, partners: dict) -> dict:
        """Open one authenticated data channel per downstream partner."""
        from experiment_design.transport import connect

        # no reply for the liveness timeout: the partner is lost (a receive never waits for
        # ever; a partner profiling or computing sends nothing only between requests)
        deadline = float((self.config.get("run") or {}).get("liveness_timeout_s")
                         or LIVENESS_TIMEOUT_S)
        for slot_peers in partners.get("downstream", []):
            ch = connect(slot_peers["host"], int(slot_peers["port"]), self.data_secret, self.codec)
            ch.set_timeout(deadline, partner=slot_peers["instance"])
            self.channels.append((slot_peers["instance"], ch))
            log.info("connected to %s at %s:%s", slot_peers["instance"], slot_peers["host"],
                     slot_peers["port"])
        if not self.channels:
            raise TracrError(f"{self.instance}: no downstream partner to send to")
        return {"channels": [name for name, _ in self.channels]}

    def prepare_partitioner(self, measured: Measurements) -> PartitionerPlan:
        """Set up the partitioner with the model facts plus the observer's measurements."""
        ctx = PartitionContext.from_dict(partition_context(self.setup_info, measured))
        self.partitioner.setup(ctx)
        return PartitionerPlan(sweep_length=self.partitioner.sweep_length(),
                               decision=self.partitioner.decision())

    def probe_link(self, size: int = 1 << 20, repeats: int = 5) -> dict:
        """``DataChannel.probe()`` when the transport has it, else an echo round trip."""
        import statistics

        import torch

        name, ch = self.channels[0]
        if hasattr(ch, "probe"):
            res = ch.probe()
            return res if isinstance(res, dict) else {"result": res}
        small = {"x": torch.zeros(1)}
        big = {"x": torch.zeros(max(1, size // 4))}
        rtts, bigs = [], []
        for _ in range(max(1, repeats)):
            for payload, sink in ((small, rtts), (big, bigs)):
                t0 = time.perf_counter()
                ch.send({"op": "echo"}, payload)
                ch.recv()
                sink.append((time.perf_counter() - t0) * 1e3)
        rtt = statistics.median(rtts)
        # the echo carries the payload both ways
        extra = max(statistics.median(bigs) - rtt, 1e-3)
        return {"partner": name, "rtt_ms": rtt, "bandwidth_Bps": 2 * size / (extra / 1e3)}

    def warmup(self, n: int) -> None:
        """n round trips at split 0 and at the last split: every layer runs on both sides."""
        if not self.inputs:
            return
        sm = self.split_model
        valid = sm.valid_splits()
        ends = sorted({valid[0], valid[-1]})
        for i in range(n):
            for k in ends:
                x, label, item = self.inputs[i % len(self.inputs)]
                self.infer(x, label, item, k, record=False)

    def infer(self, x: Any, label: Any, item: str, split: int, *,
              record: bool = True) -> InferenceRecord:
        """One split inference; returns (and, if record, emits) its row. Never raises for
        a compute error; a broken channel is recorded and then re-raised."""
        import torch

        from experiment_design.transport.errors import TransportError

        link_errors = (OSError, EOFError, TransportError)
        sm = self.split_model
        iid = self._next_id if record else -1
        if record:
            self._next_id += 1
        name, ch = self.channels[self._rr % len(self.channels)]
        self._rr += 1
        row = InferenceRecord(
            inference=iid, item=item, label=label if not isinstance(label, list)
            else ";".join(map(str, label)), split=split,
            layer=sm.points[split].layer, weights=self.weights, partner=name,
            error="",
        )
        layer_rows: list[LayerRecord] = []
        link_error: Exception | None = None
        try:
            with torch.inference_mode():
                t0, c0 = time.perf_counter_ns(), time.process_time_ns()
                crossing, pre = sm.run_prefix(split, x, timed=True)
                t1, c1 = time.perf_counter_ns(), time.process_time_ns()
                sent = ch.send({"op": "infer", "id": iid, "split": split}, crossing)
                try:
                    header, tensors, _ = ch.recv()
                except link_errors as exc:
                    link_error = exc
                    raise
                t2 = time.perf_counter_ns()
            if header.get("error"):
                raise RuntimeError(f"cloud: {header['error']}")
            edge_ms = (t1 - t0) / 1e6
            e2e_ms = (t2 - t0) / 1e6
            dec, cloud = float(header["decode_ms"]), float(header["compute_ms"])
            row.update(
                edge_ms=edge_ms, encode_ms=sent.encode_ms, decode_ms=dec, cloud_ms=cloud,
                edge_cpu_ms=(c1 - c0) / 1e6, cloud_cpu_ms=header.get("cpu_ms"),
                transfer_ms=e2e_ms - edge_ms - sent.encode_ms - dec - cloud, e2e_ms=e2e_ms,
                bytes_raw=sent.raw_bytes, bytes_encoded=sent.encoded_bytes,
                n_crossing=len(crossing),
            )
            outs = [tensors[k] for k in sorted(tensors, key=lambda s: int(s[3:]))]
            if outs:
                first = outs[0]
                row["top1"] = int(first.reshape(first.shape[0], -1)[0].argmax()) \
                    if first.dim() > 0 and first.numel() else ""
                row["output_sum"] = float(sum(float(o.double().sum()) for o in outs))
            layer_rows = [_layer(iid, "edge", sm, i, ms) for i, ms in pre]
            layer_rows += [_layer(iid, "cloud", sm, int(i), float(ms))
                           for i, ms in header.get("layers", [])]
        except link_errors as exc:
            link_error = exc
            row["error"] = f"link to {name} failed: {type(exc).__name__}: {exc}"
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        if record:
            self.emit_record(row, layer_rows)
        if link_error is not None:
            raise TracrError(row["error"])
        return row

    def finish_partners(self) -> None:
        """Tell every downstream partner this edge is done, then close the channels."""
        for name, ch in self.channels:
            try:
                ch.send({"op": "finish"}, {})
                ch.recv()
            except Exception as exc:  # partner already gone: nothing more to say
                log.warning("could not say goodbye to %s: %s", name, exc)
            finally:
                ch.close()
        self.channels = []

    def close(self) -> None:
        """Close data channels."""
        super().close()
        for _, ch in self.channels:
            try:
                ch.close()
            except OSError:
                pass


def _layer(iid: int, side: str, sm: Any, index: int, ms: float) -> LayerRecord:
    info = sm.layers[index - 1]
    return LayerRecord(inference=iid, side=side, index=index, name=info.name, type=info.type,
                       ms=ms)
