"""``neurosurgeon``: the paper's linear-regression partitioner (Sec. 3.3.3, Eq. 1-4).

At start-up each participant profiles the model (warm-up passes, per-layer
median ms in the context of the full model). From those times one line per
layer class (conv, linear, pooling, activation, norm, other) is fitted,
``L(m) = a * m + b`` (Eq. 1), where ``m`` is the layer's parameter bytes
(Eq. 2) or its input bytes if it has no parameters. The cloud's lines reach
the edge as plain numbers (``cloud_profile["models"]``, see
``regression.fit_bytes_models``); if the cloud sent only its layer times, the
same fit is done here.

The split is chosen by the paper's criterion, scanning the candidate first
cloud layer ``j_c`` from layer 1:

* ``ineq3`` (default): the first ``j_c`` with
  ``bytes(j_c)/t_s + sum_{j>=j_c} C_j < sum_{j>=j_c} E_j``;
* ``ineq4``: the first ``j_c`` with ``bytes(j_c)/t_s + C_{j_c} < E_{j_c}``
  (the paper's simplification, exact only if the cloud is faster on every
  layer *and* the transfer term does not matter; when the cloud is faster on
  every layer, ineq3 never picks a later split than ineq4).

``j_c`` is the first cloud layer, so layers ``1 .. j_c-1`` run on the edge: our
split index is ``k = j_c - 1``. If no ``j_c`` satisfies the inequality,
everything runs on the edge (``k = n``) and the decision says so.

The transfer term: the paper writes ``m_j``; by default we use the bytes that
actually cross at that cut (``transfer_bytes: crossing`` — every tensor that
crosses, skip connections included), because that is what the wire carries.
``transfer_bytes: m_j`` uses Eq. 2's ``m`` of layer ``j_c`` literally.
``t_s`` is the bandwidth measured between the two participants at start-up.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.partitioners import regression
from experiment_design.partitioners.base import (
    PartitionContext,
    Partitioner,
    register_partitioner,
)
from experiment_design.partitioners.predicted import (
    crossing_bytes,
    link,
    profile_ms,
    summarize_inputs,
    transfer_ms,
)

CRITERIA = ("ineq3", "ineq4")
TRANSFER_BYTES = ("crossing", "m_j")


def _models_for(ctx: PartitionContext, side: str, type_map: dict | None) -> tuple[dict, str]:
    """The Eq. 1 models of one side: as shipped (plain numbers) or fitted here from its layer times."""
    prof = getattr(ctx, f"{side}_profile") or {}
    if prof.get("models"):
        return regression.check_models(prof["models"]), f"shipped by the {side} (JSON coefficients)"
    models = regression.fit_bytes_models(ctx.layers, profile_ms(ctx, side), type_map=type_map)
    return models, f"fitted from the {side}'s profiled layer times"


def _fallback_notes(models: dict, side: str) -> list[str]:
    notes = []
    for cls, line in models["classes"].items():
        if line["model"] == "ratio":
            notes.append(f"{side} {cls}: {line['n']} sample(s) at one size, ratio model t = a*m")
        elif line["model"] == "constant":
            notes.append(f"{side} {cls}: no size information (m = 0), constant model t = mean")
    return notes


@register_partitioner("neurosurgeon")
class Neurosurgeon(Partitioner):
    """The paper's linear-regression partitioner (Eq. 1-4).

    Params: ``criterion`` — ``ineq3`` (default) or ``ineq4``;
    ``transfer_bytes`` — ``crossing`` (default, bytes that cross the cut) or
    ``m_j`` (the paper's literal term); ``type_map`` — ``{type name: class}``
    overrides for the layer classes; ``bandwidth_Bps`` — what-if override of
    the measured ``t_s`` (recorded as not measured).
    """

    needs = frozenset({"edge_profile", "cloud_profile", "network"})

    def __init__(
        self,
        criterion: str = "ineq3",
        transfer_bytes: str = "crossing",
        type_map: dict | None = None,
        **params: Any,
    ) -> None:
        super().__init__(
            criterion=criterion, transfer_bytes=transfer_bytes, type_map=type_map, **params
        )
        if criterion not in CRITERIA:
            raise TracrError(
                f"neurosurgeon: unknown criterion '{criterion}'.",
                hint=f"Use one of {list(CRITERIA)}.",
            )
        if transfer_bytes not in TRANSFER_BYTES:
            raise TracrError(
                f"neurosurgeon: unknown transfer_bytes '{transfer_bytes}'.",
                hint=f"Use one of {list(TRANSFER_BYTES)}.",
            )
        self.criterion = criterion
        self.transfer_bytes = transfer_bytes
        self.type_map = dict(type_map or {})
        self.k: int | None = None
        self._decision: dict = {}

    def setup(self, ctx: PartitionContext) -> None:
        """Fit (or receive) the Eq. 1 models and scan ``j_c`` with the chosen inequality."""
        super().setup(ctx)
        n = len(ctx.layers)
        edge_models, edge_src = _models_for(ctx, "edge", self.type_map)
        cloud_models, cloud_src = _models_for(ctx, "cloud", self.type_map)
        E = [regression.predict_bytes(edge_models, row) for row in ctx.layers]
        C = [regression.predict_bytes(cloud_models, row) for row in ctx.layers]
        t_s, _rtt, link_src = link(ctx, self.params)
        cross = crossing_bytes(ctx)

        def bytes_at(k: int) -> int:
            # k = j_c - 1; for m_j the paper's term is m of the first cloud layer j_c.
            if self.transfer_bytes == "m_j" and k < n:
                return regression.layer_bytes(ctx.layers[k])
            return cross[k]

        # Suffix sums: suf[k] = sum of layers k+1..n (0-based j >= k).
        sufE, sufC = [0.0] * (n + 1), [0.0] * (n + 1)
        for j in range(n - 1, -1, -1):
            sufE[j], sufC[j] = sufE[j + 1] + E[j], sufC[j + 1] + C[j]

        scan, chosen = [], None
        for k in sorted(ctx.valid_splits):
            if k >= n:
                continue  # j_c = n + 1 does not exist: that is the all-on-edge fallback
            tx = transfer_ms(bytes_at(k), t_s)
            if self.criterion == "ineq3":
                lhs, rhs = tx + sufC[k], sufE[k]
            else:
                lhs, rhs = tx + C[k], E[k]
            holds = lhs < rhs
            scan.append(
                {
                    "j_c": k + 1,
                    "k": k,
                    "bytes": bytes_at(k),
                    "transfer_ms": tx,
                    "lhs_ms": lhs,
                    "rhs_ms": rhs,
                    "holds": holds,
                }
            )
            if holds:
                chosen = k
                break
        notes = _fallback_notes(edge_models, "edge") + _fallback_notes(cloud_models, "cloud")
        if chosen is None:
            chosen = n if n in ctx.valid_splits else max(ctx.valid_splits)
            notes.append(f"no j_c satisfies {self.criterion}: all layers on the edge (k={chosen})")
        self.k = chosen

        # The paper's latency model for every split (no rtt term, as in Eq. 3), recorded so the
        # evaluation can rank the splits by it.
        prefix = [0.0, *accumulate(E)]
        pred = {k: prefix[k] + transfer_ms(bytes_at(k), t_s) + sufC[k] for k in ctx.valid_splits}
        self._decision = {
            "name": self.name,
            "chosen": chosen,
            "j_c": chosen + 1 if chosen < n else None,
            "criterion": self.criterion,
            "transfer_bytes": self.transfer_bytes,
            "params": self.params,
            "t_s_Bps": t_s,
            "link_source": link_src,
            "models": {
                "edge": edge_models,
                "cloud": cloud_models,
                "edge_source": edge_src,
                "cloud_source": cloud_src,
            },
            "layer_pred_ms": {"edge": E, "cloud": C},
            "scan": scan,
            "notes": notes,
            "inputs": summarize_inputs(ctx),
            "predicted": pred,
            "chosen_ms": pred.get(chosen),
        }

    def next_split(self) -> int:
        """The chosen split, every time."""
        if self.k is None:
            raise TracrError("neurosurgeon: next_split() called before setup().")
        return self.k

    def decision(self) -> dict:
        """Chosen split, criterion, Eq. 1 coefficients, the inequality scan, predicted ms per split."""
        return self._decision or {"name": self.name, "params": self.params, "chosen": None}
