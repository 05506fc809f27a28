"""Scoring a given placement, the exhaustive sweep of a chain, the naive baseline."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations

from experiment_design.errors import TracrError
from experiment_design.partitioners.pipeline.facts import DeviceFacts, Links, ModelFacts
from experiment_design.partitioners.pipeline.placement import (
    Placement,
    Stage,
    check_objective,
)
from experiment_design.partitioners.pipeline.search import Problem, prefix_sums


# ----- scoring a given placement, the exhaustive sweep, the naive baseline ----------------
def chain_stages(chain: Sequence[str], cuts: Sequence[int], n: int) -> list[Stage]:
    """The stages of ``chain`` separated at ``cuts`` (one fewer than the devices)."""
    if len(cuts) != len(chain) - 1:
        raise TracrError(f"A chain of {len(chain)} devices needs {len(chain) - 1} cuts, got "
                         f"{list(cuts)}.")
    bounds = [0, *cuts, n]
    return [Stage(name, bounds[i] + 1, bounds[i + 1]) for i, name in enumerate(chain)]


def predict(model: ModelFacts, stages: Sequence[Stage],
            devices: Mapping[str, DeviceFacts] | Iterable[DeviceFacts], links: Links,
            source: str, objective: str = "throughput", reason: str = "") -> Placement:
    """The predictions of a given placement under the cost model (say, one a runner was
    told to play); TracrError if ``stages`` are not a placement (see the module's rules).
    Its memory is reported per stage, not checked: see :func:`fits_memory`."""
    check_objective(objective)
    p = Problem(model, devices, links, source)
    p.check(stages)
    return p.placement(stages, objective, reason)


def fits_memory(model: ModelFacts, stages: Sequence[Stage],
                devices: Mapping[str, DeviceFacts] | Iterable[DeviceFacts]) -> bool:
    """Whether every stage's parameters fit its device's ``memory_bytes``."""
    devs = dict(devices) if isinstance(devices, Mapping) else {d.name: d for d in devices}
    pb = prefix_sums(model.param_bytes)
    return all(devs[s.device].memory_bytes is None
               or pb[s.last] - pb[s.first - 1] <= devs[s.device].memory_bytes for s in stages)


def count_placements(model: ModelFacts, k: int) -> int:
    """How many cut tuples a chain of ``k`` devices has: C(valid interior cuts, and cut 0
    where valid, k - 1), what :func:`enumerate_placements` returns when memory is
    unlimited."""
    return math.comb(len(_first_cuts(model)), k - 1) if k >= 1 else 0


def _first_cuts(model: ModelFacts) -> list[int]:
    """The cuts a tuple draws from: cut 0 (where valid: the source forwards the input, a
    placement the DP may choose) and every valid interior cut."""
    return [0, *model.interior_cuts()] if model.valid[0] else model.interior_cuts()


def enumerate_placements(model: ModelFacts, chain: Sequence[str], links: Links,
                         devices: Mapping[str, DeviceFacts] | Iterable[DeviceFacts],
                         objective: str = "throughput") -> list[Placement]:
    """Every placement of the fixed ``chain`` (``chain[0]`` is the source) with valid cuts
    0 <= c1 < ... < c_{k-1} < n (c1 = 0 where cut 0 is valid: the source only forwards
    the input, a placement :func:`plan_pipeline` may choose), in lexicographic order of
    the cuts, each with its predictions; tuples whose stages do not fit memory are left
    out. The oracle sweep."""
    check_objective(objective)
    chain = list(chain)
    if not chain or len(set(chain)) != len(chain):
        raise TracrError(f"A chain names each device once, got {chain}.")
    p = Problem(model, devices, links, chain[0])
    for a, b in [*zip(chain, chain[1:], strict=False), (chain[-1], chain[0])]:
        if a != b and p.links[p.index(a)][p.index(b)] is None:
            raise TracrError(f"No link from {a} to {b} for the chain {chain}.")
    out = []
    for cuts in combinations(_first_cuts(model), len(chain) - 1):
        stages = chain_stages(chain, cuts, model.n)
        if p.fits_stages(stages):
            out.append(p.placement(stages, objective, reason="exhaustive sweep"))
    return out


def proportional_placement(model: ModelFacts,
                           devices: Mapping[str, DeviceFacts] | Iterable[DeviceFacts],
                           chain: Sequence[str], links: Links,
                           objective: str = "throughput") -> Placement:
    """The naive baseline: ``chain[i]`` gets a share of the parameter bytes in proportion
    to its ``memory_bytes`` (an unknown memory counts as the mean of the known ones, all
    unknown as equal shares), cut at the valid cuts nearest those shares. It ignores
    speeds and links and does not check memory; it is what the DP is compared with."""
    chain = list(chain)
    p = Problem(model, devices, links, chain[0])
    known = [p.devices[p.index(name)].memory_bytes for name in chain]
    fill = sum(m for m in known if m is not None) / max(1, sum(m is not None for m in known))
    weights = [float(m if m is not None else fill or 1.0) for m in known]
    interior = model.interior_cuts()
    k = len(chain)
    if len(interior) < k - 1:
        raise TracrError(f"The model has {len(interior)} valid interior cuts; a chain of {k} "
                         f"devices needs {k - 1}.")
    total, cuts, share = p.prefix_bytes[-1], [], 0.0
    for i in range(k - 1):
        share += weights[i] / sum(weights)
        lo = interior.index(cuts[-1]) + 1 if cuts else 0
        options = interior[lo: len(interior) - (k - 2 - i)]
        cuts.append(min(options, key=lambda c: (abs(p.prefix_bytes[c] - share * total), c)))
    return p.placement(chain_stages(chain, cuts, model.n), objective,
                       reason="layers in proportion to memory")

