"""How faithful a split run's output is: the unsplit model's output as the reference, and
one inference's output compared with it (top-1 agreement, cosine, max abs difference).

The reference is computed once per input, before anything is timed; the comparison runs
after an inference's clock has stopped. Both are plain torch on the CPU in float64.
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
