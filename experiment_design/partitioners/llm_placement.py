"""Placement of a language model's decoder layers on hosts: which host runs which
contiguous range of layers, in which order, for one token's decode.

Three policies, each a pure function of the same figures (:class:`Model`, a list of
:class:`Host`, a :class:`Link`):

- :func:`memory_proportional`: every host, layers in proportion to its memory (as exo
  and llama.cpp's RPC backend place them);
- :func:`equal_slices`: every host, the same number of layers each (distributed-llama);
- :func:`tracr_placement`: a dynamic programme over contiguous layer ranges and host
  order (any subset of the hosts, one included) that minimises the time per token
  (:func:`time_per_token`) subject to every host's memory cap; it says why it chose
  what it chose (``reason``), fewer hosts or one when splitting does not pay.

The time of one decode token over a chain of ``k`` stages::

    T = sum_s compute_s + sum_cuts bytes_cut / rate + k * rtt / 2     (k > 1; else 0)

``compute_s``: the stage's host's decode ms of its layers (plus the embedding on the
head, the norm and LM head on the last); the ``k`` hops are the ``k - 1`` cuts and the
chosen token's way back to the head (``token_bytes``), each a one-way latency (half the
round trip) plus its bytes at the link's rate. A stage's memory is the weights it holds
plus its layers' KV cache for ``context_tokens`` tokens (plus ``runtime_bytes``, the
process itself, if given); a placement whose stage exceeds its host's cap is refused
with the figures (:class:`PlacementRefused`).

Example (Qwen2.5-0.5B's figures in fp32; two hosts and one four times slower, each
capped at 1.2 GB: the model, about 2 GB, fits none alone)::

    model = Model.uniform(layers=24, layer_bytes=59.6e6, kv_bytes_per_token=1024,
                          embed_bytes=544.5e6, head_bytes=544.5e6, cut_bytes=3584)
    fast = Host.uniform("lab-1", 24, 6.0, head_ms=20.0, cap=1.2e9)
    hosts = [fast, fast.scaled("lab-2", 1.0, 1.2e9), fast.scaled("lab-3", 4.0, 1.2e9)]
    tracr_placement(model, hosts, Link(rate_bytes_per_s=125e6, rtt_ms=0.2)).describe()
    # 'tracr: lab-3 1..1, lab-1 2..14, lab-2 15..24: 182.4 ms/token (the model fits no
    #  single host, so it is split over 3 of 3 hosts)'; memory-proportional: 368.4 ms
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from experiment_design.errors import TracrError

#: more hosts than this make the search over host subsets too large to be worth it
MAX_HOSTS = 10


class PlacementRefused(TracrError):
    """A placement that does not fit its hosts' memory: the message lists, per host over
    its cap, the bytes it needs against the cap."""


@dataclass(frozen=True)
class Model:
    """The figures of a model that a placement needs, per decoder layer (``n`` layers)."""

    layer_bytes: tuple[int, ...]
    kv_bytes_per_token: tuple[int, ...]
    #: the head's extra weights (the embedding) and the last stage's (norm and LM head;
    #: with tied embeddings, the embedding matrix again)
    embed_bytes: int
    head_bytes: int
    #: bytes per token crossing the cut after layer ``i`` (index ``0 .. n``)
    cut_bytes: tuple[int, ...]
    #: the token id's way back to the head
    token_bytes: int = 8

    @property
    def n(self) -> int:
        """Number of decoder layers."""
        return len(self.layer_bytes)

    @classmethod
    def uniform(cls, layers: int, layer_bytes: float, kv_bytes_per_token: int,
                embed_bytes: float, head_bytes: float, cut_bytes: int) -> Model:
        """A model whose layers are all alike (a decoder stack is)."""
        return cls((int(layer_bytes),) * layers, (int(kv_bytes_per_token),) * layers,
                   int(embed_bytes), int(head_bytes), (int(cut_bytes),) * (layers + 1))

    @classmethod
    def from_layer_facts(cls, facts: list[dict], *, embed_bytes: int, head_bytes: int,
                         hidden: int, dtype_bytes: int = 4) -> Model:
        """From a decoder stage's ``layer_facts()`` (the set-up's ``extra.llm.layers``):
        one token's hidden state crosses any cut."""
        return cls(tuple(int(f["weight_bytes"]) for f in facts),
                   tuple(int(f["kv_bytes_per_token"]) for f in facts), int(embed_bytes),
                   int(head_bytes), (hidden * dtype_bytes,) * (len(facts) + 1))


@dataclass(frozen=True)
class Host:
    """One host: its decode ms per token of each layer (measured or predicted), of the
    embedding and of the norm + LM head; its memory cap (None: unlimited) and the memory
    a memory-proportional policy sees (defaults to the cap)."""

    name: str
    layer_ms: tuple[float, ...]
    embed_ms: float = 0.0
    head_ms: float = 0.0
    cap_bytes: int | None = None
    memory_bytes: int | None = None
    runtime_bytes: int = 0

    @classmethod
    def uniform(cls, name: str, layers: int, layer_ms: float, *, head_ms: float = 0.0,
                cap: float | None = None, memory: float | None = None) -> Host:
        """A host on which every layer takes ``layer_ms``."""
        return cls(name, (float(layer_ms),) * layers, 0.0, float(head_ms),
                   None if cap is None else int(cap), None if memory is None else int(memory))

    def scaled(self, name: str, factor: float, cap: float | None = None) -> Host:
        """A host ``factor`` times slower (a predicted one: e.g. 0.15 of a core where this
        host had 0.6: ``factor = 4``)."""
        return Host(name, tuple(ms * factor for ms in self.layer_ms), self.embed_ms * factor,
                    self.head_ms * factor, None if cap is None else int(cap),
                    None if cap is None else int(cap), self.runtime_bytes)

    @property
    def memory(self) -> int | None:
        """What a memory-proportional policy sees."""
        return self.memory_bytes if self.memory_bytes is not None else self.cap_bytes


@dataclass(frozen=True)
class Link:
    """The link between any two hosts: its rate and round trip."""

    rate_bytes_per_s: float
    rtt_ms: float = 0.0

    def hop_ms(self, nbytes: int) -> float:
        """One hop: half the round trip plus the bytes at the rate."""
        return self.rtt_ms / 2 + nbytes / self.rate_bytes_per_s * 1e3


@dataclass(frozen=True)
class Stage:
    """One host's part of a placement: layers ``a + 1 .. b``."""

    host: str
    a: int
    b: int
    compute_ms: float
    memory_bytes: int
    cap_bytes: int | None

    @property
    def fits(self) -> bool:
        """Within its host's cap."""
        return self.cap_bytes is None or self.memory_bytes <= self.cap_bytes

    def to_dict(self) -> dict:
        """Plain JSON view."""
        return {"host": self.host, "layers": [self.a + 1, self.b],
                "compute_ms": self.compute_ms, "memory_bytes": self.memory_bytes,
                "cap_bytes": self.cap_bytes, "fits": self.fits}


@dataclass(frozen=True)
class Placement:
    """A placement and its time per token (see the module docstring)."""

    policy: str
    stages: tuple[Stage, ...]
    compute_ms: float
    transfer_ms: float
    ms_per_token: float
    reason: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def cuts(self) -> list[int]:
        """The cuts between stages (decoder-layer boundaries)."""
        return [s.b for s in self.stages[:-1]]

    @property
    def hosts(self) -> list[str]:
        """The hosts in chain order."""
        return [s.host for s in self.stages]

    @property
    def fits(self) -> bool:
        """Every stage within its host's cap."""
        return all(s.fits for s in self.stages)

    @property
    def bottleneck_ms(self) -> float:
        """The slowest stage's compute per token: the bound of a pipeline with many
        sequences in flight (tokens/s <= 1000 / this)."""
        return max(s.compute_ms for s in self.stages)

    def check(self) -> Placement:
        """This placement if it fits; else :class:`PlacementRefused` with the figures."""
        over = [s for s in self.stages if not s.fits]
        if over:
            raise PlacementRefused(
                f"{self.policy} placement does not fit: " + "; ".join(
                    f"{s.host} (layers {s.a + 1}..{s.b}) needs {_mb(s.memory_bytes)}, "
                    f"cap {_mb(s.cap_bytes)}" for s in over),
                hint="raise the caps, add hosts, or let tracr place it (tracr_placement)")
        return self

    def describe(self) -> str:
        """One line: hosts, layers, time per token, and why."""
        parts = ", ".join(f"{s.host} {s.a + 1}..{s.b}" for s in self.stages)
        line = f"{self.policy}: {parts}: {self.ms_per_token:.1f} ms/token"
        return f"{line} ({self.reason})" if self.reason else line

    def to_dict(self) -> dict:
        """Plain JSON view."""
        return {"policy": self.policy, "hosts": self.hosts, "cuts": self.cuts,
                "stages": [s.to_dict() for s in self.stages], "compute_ms": self.compute_ms,
                "transfer_ms": self.transfer_ms, "ms_per_token": self.ms_per_token,
                "bottleneck_ms": self.bottleneck_ms, "fits": self.fits,
                "reason": self.reason}


def _mb(b: int | None) -> str:
    return "unlimited" if b is None else f"{b / 1e6:.1f} MB"


def stage_memory(model: Model, host: Host, a: int, b: int, context_tokens: int) -> int:
    """The bytes a stage running layers ``a + 1 .. b`` needs on ``host``."""
    w = sum(model.layer_bytes[a:b]) + (model.embed_bytes if a == 0 else 0)
    w += model.head_bytes if b == model.n else 0
    return w + sum(model.kv_bytes_per_token[a:b]) * context_tokens + host.runtime_bytes


def stage_ms(model: Model, host: Host, a: int, b: int) -> float:
    """``host``'s decode ms per token of layers ``a + 1 .. b`` (and the ends)."""
    ms = sum(host.layer_ms[a:b]) + (host.embed_ms if a == 0 else 0.0)
    return ms + (host.head_ms if b == model.n else 0.0)


def time_per_token(model: Model, hosts: list[Host], bounds: list[int], link: Link, *,
                   policy: str = "given", context_tokens: int = 512, reason: str = ""
                   ) -> Placement:
    """The placement of ``hosts`` (chain order) running the ranges between ``bounds``
    (``[0, c1, .., n]``) and its time per token (module docstring). Not checked against
    the caps: see :meth:`Placement.check`."""
    if len(bounds) != len(hosts) + 1 or bounds[0] != 0 or bounds[-1] != model.n:
        raise TracrError(f"bounds {bounds} do not cover {model.n} layers in "
                         f"{len(hosts)} stages")
    _check_hosts(model, hosts)
    stages = tuple(Stage(h.name, a, b, stage_ms(model, h, a, b),
                         stage_memory(model, h, a, b, context_tokens), h.cap_bytes)
                   for h, a, b in zip(hosts, bounds, bounds[1:], strict=False))
    compute = sum(s.compute_ms for s in stages)
    transfer = 0.0
    if len(stages) > 1:
        transfer = sum(link.hop_ms(model.cut_bytes[c]) for c in bounds[1:-1])
        transfer += link.hop_ms(model.token_bytes)
    return Placement(policy, stages, compute, transfer, compute + transfer, reason)


def _check_hosts(model: Model, hosts: list[Host]) -> None:
    if not hosts:
        raise TracrError("a placement needs at least one host")
    for h in hosts:
        if len(h.layer_ms) != model.n:
            raise TracrError(f"host {h.name} has decode times for {len(h.layer_ms)} "
                             f"layers; the model has {model.n}")
    if len({h.name for h in hosts}) != len(hosts):
        raise TracrError(f"host names repeat: {[h.name for h in hosts]}")


def _apportion(n: int, weights: list[float]) -> list[int]:
    """``n`` layers in proportion to ``weights`` (largest remainders)."""
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in order[:n - sum(counts)]:
        counts[i] += 1
    return counts


def _from_counts(model: Model, hosts: list[Host], counts: list[int], link: Link,
                 policy: str, context_tokens: int) -> Placement:
    kept = [(h, c) for h, c in zip(hosts, counts, strict=True) if c > 0]
    bounds = [0]
    for _, c in kept:
        bounds.append(bounds[-1] + c)
    return time_per_token(model, [h for h, _ in kept], bounds, link, policy=policy,
                          context_tokens=context_tokens)


def memory_proportional(model: Model, hosts: list[Host], link: Link, *,
                        context_tokens: int = 512) -> Placement:
    """Every host in the given order, layers in proportion to its memory (its cap, or
    ``memory_bytes``); equal slices where no host states its memory. Not checked
    against the caps (:meth:`Placement.check` refuses one that does not fit)."""
    _check_hosts(model, hosts)
    mem = [h.memory for h in hosts]
    if any(m is None for m in mem):
        return equal_slices(model, hosts, link, context_tokens=context_tokens,
                            policy="memory-proportional")
    counts = _apportion(model.n, [float(m or 0) for m in mem])
    return _from_counts(model, hosts, counts, link, "memory-proportional", context_tokens)


def equal_slices(model: Model, hosts: list[Host], link: Link, *, context_tokens: int = 512,
                 policy: str = "equal-slices") -> Placement:
    """Every host in the given order, the same number of layers each (the first ones
    one more where ``n`` does not divide)."""
    _check_hosts(model, hosts)
    counts = _apportion(model.n, [1.0] * len(hosts))
    return _from_counts(model, hosts, counts, link, policy, context_tokens)


def tracr_placement(model: Model, hosts: list[Host], link: Link, *,
                    context_tokens: int = 512, split_margin: float = 0.0) -> Placement:
    """The fastest placement per token over any ordered subset of ``hosts`` and any
    contiguous ranges, every stage within its host's cap (a dynamic programme over
    (layers placed, hosts used)); with its reason. :class:`PlacementRefused` if no
    placement fits, with the memory the model needs against the caps.

    ``split_margin``: a placement over several hosts is chosen over the fastest single
    host that fits only if it is faster by more than this fraction of that host's time
    (the figures' resolution: measured figures that differ by less cannot tell the two
    apart, and a split adds hops the figures may not fully cost)."""
    _check_hosts(model, hosts)
    if len(hosts) > MAX_HOSTS:
        raise TracrError(f"{len(hosts)} hosts: the search covers at most {MAX_HOSTS}")
    n, h = model.n, len(hosts)
    inf = math.inf
    # best[i][mask]: least time of placing layers 1..i on the hosts in mask, the cut at
    # i (if i < n) paid; back[i][mask]: (previous i, host) of that best
    best = [[inf] * (1 << h) for _ in range(n + 1)]
    back: list[list[tuple[int, int] | None]] = [[None] * (1 << h) for _ in range(n + 1)]
    best[0][0] = 0.0
    fits = [[[stage_memory(model, hosts[j], a, b, context_tokens) <= (hosts[j].cap_bytes
              if hosts[j].cap_bytes is not None else inf) for b in range(n + 1)]
             for a in range(n + 1)] for j in range(h)]
    for a in range(n):
        for mask in range(1 << h):
            t0 = best[a][mask]
            if t0 == inf:
                continue
            for j in range(h):
                if mask >> j & 1:
                    continue
                for b in range(a + 1, n + 1):
                    if not fits[j][a][b]:
                        continue
                    t = t0 + stage_ms(model, hosts[j], a, b)
                    if b < n:
                        t += link.hop_ms(model.cut_bytes[b])
                    nm = mask | 1 << j
                    if t < best[b][nm]:
                        best[b][nm], back[b][nm] = t, (a, j)
    candidates = []
    for mask in range(1, 1 << h):
        if best[n][mask] == inf:
            continue
        k = bin(mask).count("1")
        candidates.append((best[n][mask] + (link.hop_ms(model.token_bytes) if k > 1 else 0.0),
                           k, mask))
    if not candidates:
        raise _nothing_fits(model, hosts, context_tokens)
    _, _, mask = min(candidates)
    split_ms = min((t for t, k, _ in candidates if k > 1), default=None)
    ones = [(t, m) for t, k, m in candidates if k == 1]
    if ones and split_ms is not None and min(ones)[0] * (1 - split_margin) <= split_ms:
        mask = min(ones)[1]
    order, bounds, i = [], [n], n
    while i > 0:
        a, j = back[i][mask]  # type: ignore[misc]
        order.append(hosts[j])
        bounds.append(a)
        mask &= ~(1 << j)
        i = a
    order.reverse()
    bounds.reverse()
    chosen = time_per_token(model, order, bounds, link, policy="tracr",
                            context_tokens=context_tokens)
    return _with_reason(chosen, model, hosts, link, context_tokens, split_ms, split_margin)


def _nothing_fits(model: Model, hosts: list[Host], context_tokens: int) -> PlacementRefused:
    need = stage_memory(model, Host("", (0.0,) * model.n), 0, model.n, context_tokens)
    caps = [h.cap_bytes for h in hosts]
    total = None if any(c is None for c in caps) else sum(c or 0 for c in caps)
    return PlacementRefused(
        f"no placement fits: the model needs {_mb(need)} (weights and a "
        f"{context_tokens}-token KV cache) plus each host's runtime; caps "
        + ", ".join(f"{h.name} {_mb(h.cap_bytes)}" for h in hosts)
        + (f" ({_mb(total)} in all)" if total is not None else "")
        + "; the embedding and the LM head each need one host that holds them",
        hint="raise the caps, add hosts, or shorten the context")


def best_single(model: Model, hosts: list[Host], link: Link, context_tokens: int = 512
                ) -> Placement | None:
    """The fastest one-host placement that fits (None if none does)."""
    ones = [time_per_token(model, [h], [0, model.n], link, policy="single",
                           context_tokens=context_tokens) for h in hosts]
    ones = [p for p in ones if p.fits]
    return min(ones, key=lambda p: p.ms_per_token) if ones else None


def _with_reason(p: Placement, model: Model, hosts: list[Host], link: Link,
                 context_tokens: int, split_ms: float | None, margin: float = 0.0
                 ) -> Placement:
    single = best_single(model, hosts, link, context_tokens)
    if len(p.stages) == 1:
        if len(hosts) == 1:
            why = "one host given"
        elif split_ms is None:
            why = f"only {p.hosts[0]} can hold a stage of it"
        elif split_ms < p.ms_per_token:
            why = (f"one host ({p.hosts[0]}, {p.ms_per_token:.1f} ms per token): the best "
                   f"split ({split_ms:.1f} ms) would save "
                   f"{1 - split_ms / p.ms_per_token:.1%}, within the figures' resolution "
                   f"({margin:.1%})")
        else:
            two_hops = link.hop_ms(model.cut_bytes[model.n // 2]) + link.hop_ms(
                model.token_bytes)
            why = (f"one host ({p.hosts[0]}) is fastest: the best split takes "
                   f"{split_ms:.1f} ms per token, its link alone costs {two_hops:.1f} ms "
                   "per cut and more than the compute it saves")
    elif single is None:
        why = (f"the model fits no single host, so it is split over {len(p.stages)} of "
               f"{len(hosts)} hosts")
    else:
        why = (f"splitting over {len(p.stages)} hosts saves "
               f"{single.ms_per_token - p.ms_per_token:.1f} ms per token against the "
               f"best single host ({single.hosts[0]}, {single.ms_per_token:.1f} ms)")
    if len(p.stages) == 1 and margin > 0:
        tied = [o for o in (time_per_token(model, [h], [0, model.n], link, policy="single",
                                           context_tokens=context_tokens)
                            for h in hosts if h.name != p.hosts[0])
                if o.fits and o.ms_per_token <= p.ms_per_token * (1 + margin)]
        if tied:
            why += ("; as fast within the figures' resolution "
                    f"({margin:.1%}), which cannot tell them apart: "
                    + ", ".join(f"{o.hosts[0]} alone ({o.ms_per_token:.1f} ms)" for o in tied))
    unused = [h.name for h in hosts if h.name not in p.hosts]
    if unused and len(p.stages) > 1:
        why += f"; unused: {', '.join(unused)} (adding them does not pay)"
    return Placement(p.policy, p.stages, p.compute_ms, p.transfer_ms, p.ms_per_token, why)


def compare(model: Model, hosts: list[Host], link: Link, *, context_tokens: int = 512
            ) -> dict[str, Placement]:
    """The three policies on the same figures (unchecked: see ``fits``)."""
    return {"memory-proportional": memory_proportional(model, hosts, link,
                                                       context_tokens=context_tokens),
            "equal-slices": equal_slices(model, hosts, link, context_tokens=context_tokens),
            "tracr": tracr_placement(model, hosts, link, context_tokens=context_tokens)}
