"""How faithful a split run's output is: the unsplit model's output as the reference, and
one inference's output compared with it (top-1 agreement, cosine, max abs difference).

The reference is computed once per input, before anything is timed; the comparison runs
after an inference's clock has stopped. Both are plain torch on the CPU in float64.

torch, the split engine and the transport (which load torch) are imported inside the
functions that use them, for start-up time: ``tracr experiment validate`` imports this
module through the roles and loads no torch (``tests/unit/test_cli_experiment.py``).
"""

from __future__ import annotations

from typing import Any


def transport_label(cfg: Any) -> str:
    """A short name for a transport (a CodecConfig): its own ``label`` when it has one
    (``"int8+zstd-1"``, ``"jpeg-q90"``), else ``"raw"`` or ``"<codec>-<level>"``."""
    label = getattr(cfg, "label", None)
    if isinstance(label, str) and label:
        return label
    if cfg is None or getattr(cfg, "codec", "none") == "none":
        return "raw"
    return f"{cfg.codec}-{cfg.level}"


def reference_outputs(sm: Any, inputs: list) -> dict[int, list]:
    """The unsplit model's outputs (flattened, on the CPU) for each preloaded input, by
    ``id`` of the input tensor (the head passes the same objects to every inference).
    Untimed: call it at set-up, outside any measured region."""
    import torch

    from experiment_design.split import flatten_output

    refs: dict[int, list] = {}
    with torch.inference_mode():
        for x, _, _ in inputs:
            out, _ = sm.run_full(x, timed=False)
            refs[id(x)] = [t.detach().to("cpu", copy=True) for t in flatten_output(out)]
    return refs


def top1s(t: Any) -> list[int]:
    """The argmax class of each item of a batch of outputs (``[]`` for a scalar)."""
    if t.dim() == 0 or not t.numel():
        return []
    return [int(i) for i in t.reshape(t.shape[0], -1).argmax(dim=1)]


def compare(outs: list, ref: list) -> dict[str, Any]:
    """``top1_agree`` (1 when every batch item's top-1 class of the first output matches),
    ``cosine`` (of all outputs flattened and concatenated, float64) and ``max_abs_diff``;
    outputs identical to the reference give exactly 1, 1.0 and 0.0. Outputs that do not
    match the reference's number or shapes compare as nothing (an empty dict)."""
    import torch

    if not outs or len(outs) != len(ref):
        return {}
    outs = [o.detach().cpu() for o in outs]
    if any(tuple(o.shape) != tuple(r.shape) for o, r in zip(outs, ref, strict=True)):
        return {}
    if all(o.dtype == r.dtype and torch.equal(o, r) for o, r in zip(outs, ref, strict=True)):
        return {"top1_agree": 1, "cosine": 1.0, "max_abs_diff": 0.0}
    a = torch.cat([o.double().reshape(-1) for o in outs])
    b = torch.cat([r.double().reshape(-1) for r in ref])
    na, nb = float(a.norm()), float(b.norm())
    if na == 0.0 or nb == 0.0:
        cosine = 1.0 if na == nb else 0.0
    else:
        cosine = float(a.dot(b)) / (na * nb)
    return {"top1_agree": int(top1s(outs[0]) == top1s(ref[0])),
            "cosine": min(1.0, max(-1.0, cosine)),
            "max_abs_diff": float((a - b).abs().max()) if a.numel() else 0.0}


def spread(splits: list[int], most: int) -> list[int]:
    """At most ``most`` of ``splits`` (sorted), evenly spaced, the first and last kept."""
    splits = sorted(splits)
    if most <= 0 or len(splits) <= most:
        return splits
    if most == 1:
        return splits[:1]
    step = (len(splits) - 1) / (most - 1)
    return sorted({splits[round(i * step)] for i in range(most)})


def probe(sm: Any, inputs: list, refs: dict[int, list], pairs: list[tuple[int, Any]],
          items: int = 2, timing_repeats: int = 3) -> dict[str, Any]:
    """The start-up fidelity probe: for each ``(split, CodecConfig)`` of ``pairs``, on the
    first ``items`` preloaded inputs, run the prefix, encode every crossing tensor with the
    transport and decode it (the codec functions, no socket), run the suffix and compare
    with the unsplit reference (``refs``, from :func:`reference_outputs`).

    One row per pair: ``top1_agree`` (the share of items whose top-1 class matches),
    ``cosine_min``, ``max_abs_diff``, ``bytes`` (what the pair puts on the wire: payload plus
    the lossy parameters' bytes) and ``bytes_raw``, ``encode_ms`` and ``decode_ms`` (the
    fastest of ``timing_repeats`` runs per item, median over the items: on an edge under a
    CPU quota a single run catches the throttling stalls -- in the lab at 0.25 core the probe
    timed jpeg-q50's encode at 12.4 ms where the run's inferences took 1.0 ms -- and the
    quota's effect on a whole pass belongs to the partitioner's edge model, not to the
    codec's cost); ``decode_cpu_ms``, the same runs' CPU time of the decode (the far side
    decodes, so the head's wall time for it carries the head's own pace: the quota or the
    pacer of a slowed edge; split-codec moves this CPU time to the far side's speed);
    ``not_applied`` names a reduction asked for and not applied (and why).
    The prefix runs once per split and item, whatever the number of transports.
    """
    import statistics
    import time

    import torch

    from experiment_design.split import flatten_output
    from experiment_design.transport.codec import decode, encode_tensor, parse_entry

    t_start = time.perf_counter()
    chosen = [(x, refs[id(x)]) for x, _, _ in inputs[: max(1, int(items))] if id(x) in refs]
    by_split: dict[int, list[Any]] = {}
    for k, cfg in pairs:
        by_split.setdefault(int(k), []).append(cfg)
    rows = []
    warm: set[str] = set()
    with torch.inference_mode():
        for k in sorted(by_split):
            crossings = [sm.run_prefix(k, x)[0] if k else {sm.input_name: x} for x, _ in chosen]
            for cfg in by_split[k]:
                got: dict[str, list] = {"agree": [], "cos": [], "diff": [], "bytes": [],
                                        "raw": [], "enc": [], "dec": [], "dec_cpu": []}
                skipped = set()
                if transport_label(cfg) not in warm and crossings:  # a codec's first call
                    warm.add(transport_label(cfg))  # pays for its set-up: not timed
                    for name, v in crossings[0].items():
                        if isinstance(v, torch.Tensor):
                            e = encode_tensor(name, v, cfg)
                            decode(parse_entry(e.entry()), e.payload())
                for crossing, (_, ref) in zip(crossings, chosen, strict=True):
                    enc_ms, dec_ms, dec_cpu = [], [], []
                    for _ in range(max(1, int(timing_repeats))):
                        t0 = time.perf_counter()
                        encoded = {name: encode_tensor(name, v, cfg)
                                   for name, v in crossing.items()
                                   if isinstance(v, torch.Tensor)}
                        t1 = time.perf_counter()
                        wire = {name: (e.entry(), e.payload()) for name, e in encoded.items()}
                        t2, c2 = time.perf_counter(), time.process_time()
                        received = dict(crossing)
                        received.update({name: decode(parse_entry(entry), payload)
                                         for name, (entry, payload) in wire.items()})
                        t3, c3 = time.perf_counter(), time.process_time()
                        enc_ms.append((t1 - t0) * 1e3)
                        dec_ms.append((t3 - t2) * 1e3)
                        dec_cpu.append((c3 - c2) * 1e3)
                    out, _ = sm.run_suffix(k, received)
                    cmp = compare(flatten_output(out), ref)
                    got["enc"].append(min(enc_ms))
                    got["dec"].append(min(dec_ms))
                    got["dec_cpu"].append(min(dec_cpu))
                    got["bytes"].append(sum(e.encoded_nbytes + e.param_nbytes
                                            for e in encoded.values()))
                    got["raw"].append(sum(e.raw_nbytes for e in encoded.values()))
                    skipped |= {f"{e.lossy['wanted']}: {e.lossy['why']}"
                                for e in encoded.values()
                                if e.lossy and e.lossy.get("method") == "none"}
                    if cmp:
                        got["agree"].append(cmp["top1_agree"])
                        got["cos"].append(cmp["cosine"])
                        got["diff"].append(cmp["max_abs_diff"])
                rows.append({
                    "split": k, "transport": transport_label(cfg),
                    "top1_agree": statistics.fmean(got["agree"]) if got["agree"] else None,
                    "cosine_min": min(got["cos"]) if got["cos"] else None,
                    "max_abs_diff": max(got["diff"]) if got["diff"] else None,
                    "bytes": int(statistics.median(got["bytes"])),
                    "bytes_raw": int(statistics.median(got["raw"])),
                    "encode_ms": statistics.median(got["enc"]),
                    "decode_ms": statistics.median(got["dec"]),
                    "decode_cpu_ms": statistics.median(got["dec_cpu"]),
                    **({"not_applied": sorted(skipped)} if skipped else {}),
                })
    return {"items": len(chosen), "pairs": rows,
            "seconds": round(time.perf_counter() - t_start, 3)}
