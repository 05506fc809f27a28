"""The manifest schema: every key, its type, its default and its range.

The schema is data (:class:`Field` trees), so defaults, ``tracr experiment
show`` and validation all read the same description. Name checks against
registries (roles, tasks, ...) live in :mod:`app_api.manifest.names`.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app_api.manifest.errors import KeyPath
from app_api.units import parse_limits, parse_rate
from experiment_design.constants import CODECS, FILTERS, GRANULARITIES, LOSSY, SPLIT_MODES
from experiment_design.energy import list_energy
from experiment_design.errors import TracrError

REQUIRED: Any = object()
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_TYPE_WORDS = {
    "str": "a string",
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "map": "a mapping",
    "list": "a list",
}


@dataclass(frozen=True)
class Field:
    """One key of the schema.

    ``kind`` is str/int/number/bool/map/list/any; maps have fixed ``keys``
    and/or free keys whose values follow ``values``; ``open`` maps also take
    keys of any type. ``pre`` rewrites a shorthand before checking (``model:
    alexnet`` -> ``{name: alexnet}``); ``check`` returns a problem or None.
    """

    kind: str
    default: Any = REQUIRED
    nullable: bool = False
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None
    keys: dict[str, Field] | None = None
    values: Field | None = None
    items: Field | None = None
    open: bool = False
    pre: Callable[[Any], Any] | None = None
    check: Callable[[Any], str | None] | None = None
    doc: str = ""

    def default_value(self) -> Any:
        """A fresh copy of the default."""
        return copy.deepcopy(self.default)


class SchemaProblem(Exception):
    """Raised by :func:`validate` with the key path and the problem text."""

    def __init__(self, path: KeyPath, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.message = message
        self.hint = hint


def _name_check(v: str) -> str | None:
    if not NAME_RE.match(v):
        return f"'{v}' is not a valid name (letters, digits, '-' and '_'; no dots or spaces)"
    return None


def _rate_check(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        return f"must be a rate such as '4MB/s' or '100Mbit', not {_describe(v)}"
    try:
        parse_rate(v)
    except TracrError as exc:
        return f"{exc.message} ({exc.hint})" if exc.hint else exc.message
    return None


def _energy_check(v: Any) -> str | None:
    """``settings.energy``: collector names (a list, or a mapping to their parameters),
    each registered (``experiment_design.energy``), or ``none``."""
    if v in (None, "none"):
        return None
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, dict)) or not all(isinstance(n, str) for n in v):
        return ("must be a list of energy collectors (or a mapping to their parameters), "
                f"not {_describe(v)}")
    if isinstance(v, dict) and not all(p is None or isinstance(p, dict) for p in v.values()):
        return "each collector's parameters must be a mapping"

    valid = list_energy()
    unknown = [n for n in v if n not in valid]
    if unknown:
        return (f"unknown energy collector '{unknown[0]}'. The valid options are "
                f"[{', '.join(valid)}].")
    return None


def _settings_check(v: dict) -> str | None:
    """``settings.sampler_ms`` (a number >= 0) and ``settings.energy``, where given."""
    ms = v.get("sampler_ms")
    if ms is not None and (isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms < 0):
        return f"sampler_ms must be a number of ms >= 0 (0: no sampler), not {_describe(ms)}"
    problem = _energy_check(v.get("energy"))
    return f"energy: {problem}" if problem else None


def _lab_check(v: dict) -> str | None:
    """The hosts ``lab.cpu`` and ``lab.memory`` name must be among the ``lab.hosts`` the
    lab has; each memory cap must be a size."""
    hosts = v.get("hosts")
    if not isinstance(hosts, int) or isinstance(hosts, bool):
        return None  # the key's own check says what is wrong
    valid = [f"lab-{i}" for i in range(1, hosts + 1)]
    for key in ("cpu", "memory"):
        for name in v.get(key) or {}:
            if name not in valid:
                close = difflib.get_close_matches(str(name), valid, n=1)
                return (f"lab.{key} names '{name}', which a lab of {hosts} host(s) does not "
                        "have." + (f" Did you mean '{close[0]}'?" if close else "")
                        + f" The valid options are [{', '.join(valid)}].")
    try:
        parse_limits(dict(v.get("memory") or {}), hosts)
    except TracrError as exc:
        return f"lab.memory: {exc.message}"
    return None


def _mapping_or(name_key: str) -> Callable[[Any], Any]:
    """Accept ``key: value`` as shorthand for ``key: {name_key: value}``."""

    def pre(v: Any) -> Any:
        return {name_key: v} if isinstance(v, str) else v

    return pre


def _task_item(v: Any) -> Any:
    return {"task": v} if isinstance(v, str) else v


TASK = Field(
    "map",
    pre=_task_item,
    keys={
        "task": Field("str", doc="task name (experiment_design.tasks)"),
        "params": Field("map", default={}, open=True, doc="task parameters"),
    },
)

SCHEMA = Field(
    "map",
    keys={
        "description": Field("str", default="", doc="one line shown by `tracr experiment ls`"),
        "plugins": Field("list", default=[], items=Field("str"),
                         doc="modules of your own package to import (what they register: "
                             "models, datasets, partitioners, roles, tasks); app_api.plugins"),
        "model": Field(
            "map",
            pre=_mapping_or("name"),
            keys={
                "name": Field("str", doc="registered model or torchvision:<name>"),
                "weights": Field("str", default=None, nullable=True),
                "depth": Field("int", default=None, nullable=True, min=1),
                "mode": Field("str", default="auto", choices=SPLIT_MODES),
                "batch": Field("int", default=1, min=1),
            },
        ),
        "participant_types": Field(
            "map",
            values=Field(
                "map",
                keys={
                    "role": Field("str"),
                    "model": Field("str", default=None, nullable=True),
                    "settings": Field(
                        "map",
                        default={"threads": None},
                        open=True,
                        keys={"threads": Field("int", default=None, nullable=True, min=1)},
                        check=_settings_check,
                        doc="the participant's settings; also sampler_ms (the metrics "
                            "sampler's period, 50 by default, 0 for none) and energy (energy "
                            "collectors: names, or name -> parameters, or 'none'; by default "
                            "rapl, nvml, jetson, estimate)",
                    ),
                },
            ),
        ),
        "participant_instances": Field(
            "list",
            items=Field(
                "map",
                keys={
                    "name": Field("str", check=_name_check),
                    "type": Field("str"),
                    "device": Field("str", default="localhost"),
                },
            ),
        ),
        "playbook": Field("map", values=Field("list", items=TASK)),
        "partitioner": Field(
            "map",
            default={"name": "cyclic", "params": {}},
            pre=_mapping_or("name"),
            keys={"name": Field("str"), "params": Field("map", default={}, open=True)},
        ),
        "dataset": Field(
            "map",
            default={"name": "sample", "params": {}},
            pre=_mapping_or("name"),
            keys={"name": Field("str"), "params": Field("map", default={}, open=True)},
        ),
        "transport": Field(
            "map",
            default={"codec": "zstd", "level": 1, "filter": "shuffle", "encrypt": False,
                     "lossy": "none", "granularity": "tensor", "quality": 90},
            keys={
                "codec": Field("str", default="zstd", choices=CODECS),
                "level": Field("int", default=1, min=0, max=9),
                "filter": Field("str", default="shuffle", choices=FILTERS),
                "encrypt": Field(
                    "bool", default=False, doc="encrypt tensors between participants (AES-GCM)"
                ),
                "lossy": Field("str", default="none", choices=LOSSY,
                               doc="reduce floating tensors before the codec (jpeg/webp: the "
                                   "model's input only)"),
                "granularity": Field("str", default="tensor", choices=GRANULARITIES,
                                     doc="int8/int4 scale per tensor or per channel (dim 1)"),
                "quality": Field("int", default=90, min=1, max=100, doc="jpeg/webp quality"),
            },
        ),
        "run": Field(
            "map",
            default={"warmup": 2, "repeats": 1, "seed": 0, "timeout_s": None,
                     "liveness_timeout_s": 30, "startup_timeout_s": 600},
            keys={
                "warmup": Field("int", default=2, min=0, doc="inferences run and discarded first"),
                "repeats": Field("int", default=1, min=1),
                "seed": Field("int", default=0, min=0),
                "timeout_s": Field("number", default=None, nullable=True, min=0),
                "liveness_timeout_s": Field("number", default=30, min=1,
                                            doc="a participant silent this long is lost"),
                "startup_timeout_s": Field("number", default=600, min=1,
                                           doc="cap on a participant's start-up"),
            },
        ),
        "network": Field(
            "map",
            default={
                "bandwidth": None,
                "bandwidths": None,
                "delay_ms": None,
                "jitter_ms": None,
                "loss_pct": None,
                "trace": None,
            },
            keys={
                "bandwidth": Field("any", default=None, nullable=True, check=_rate_check),
                "bandwidths": Field(
                    "list", default=None, nullable=True, items=Field("any", check=_rate_check)
                ),
                "delay_ms": Field("number", default=None, nullable=True, min=0,
                                  doc="one-way delay on each host's egress (a round trip "
                                      "between two hosts is twice it)"),
                "jitter_ms": Field("number", default=None, nullable=True, min=0,
                                   doc="delay jitter (never reorders)"),
                "loss_pct": Field("number", default=None, nullable=True, min=0, max=100),
                "trace": Field("str", default=None, nullable=True,
                               doc="the link's rate follows this trace (a shipped steady, "
                                   "step, sawtooth, walk scaled to bandwidth, or a Mahimahi "
                                   "or time_s,rate CSV file)"),
            },
        ),
        "lab": Field(
            "map",
            default=None,
            nullable=True,
            doc="the emulated lab this experiment needs (app_api.lab.requirement); the run "
                "checks the lab that is up against it before any device is touched",
            check=_lab_check,
            keys={
                "hosts": Field("int", min=1, max=200, doc="how many lab hosts"),
                "cpu": Field("map", default={}, values=Field("number", min=0.001, max=64),
                             doc="host -> share of one core (hosts not named: unlimited)"),
                "cpu_mode": Field("str", default="quota", choices=("quota", "duty"),
                                  doc="how a share slows a host (tracr lab up --cpu-mode)"),
                "cpu_period_ms": Field("number", default=None, nullable=True, min=0.1,
                                       doc="CFS period or pacer tick (null: the mode's default)"),
                "memory": Field("map", default={}, values=Field("str"),
                                doc="host -> memory cap, e.g. 600MB (tracr lab up --memory; "
                                    "hosts not named: uncapped)"),
                "pin": Field("bool", default=True, doc="one CPU per host (tracr lab up)"),
                "on_mismatch": Field("str", default="refuse", choices=("refuse", "record"),
                                     doc="refuse: a lab that differs stops the run; record: "
                                         "run and record the differences (summary lab_check)"),
            },
        ),
        "pipeline": Field(
            "map",
            default={"chain": None, "modes": ["throughput", "latency"], "count": 32,
                     "in_flight": 4, "queue": 2, "baselines": True},
            doc="a chain of k >= 2 stages (the infer-pipeline task)",
            keys={
                "chain": Field("list", default=None, nullable=True, items=Field("str"),
                               doc="participant instances in stage order; the first holds "
                                   "the inputs (null: the edge and its clouds)"),
                "modes": Field("list", default=["throughput", "latency"],
                               items=Field("str", choices=("throughput", "latency")),
                               doc="throughput: up to in_flight at once; latency: one at a time"),
                "count": Field("int", default=32, min=1,
                               doc="inferences per configuration and mode"),
                "in_flight": Field("int", default=4, min=1,
                                   doc="inferences in the chain at once (throughput mode)"),
                "queue": Field("int", default=2, min=1,
                               doc="each stage's queue between receiving, computing, sending"),
                "baselines": Field("bool", default=True,
                                   doc="also run the whole model on each participant alone"),
            },
        ),
        "evaluate": Field(
            "map",
            default={"partitioners": []},
            keys={"partitioners": Field("list", default=[], items=Field("str")),
                  "hindsight": Field(
                      "map", default=None, nullable=True,
                      doc="an adaptive partitioner scored against its hindsight sweep "
                          "(app_api.results.hindsight)",
                      keys={"interval_s": Field("number", default=10.0, min=0.01,
                                                doc="seconds of the trace per interval"),
                            "min_samples": Field("int", default=2, min=1,
                                                 doc="sweep inferences a split needs in an "
                                                     "interval to be ranked there")})},
        ),
    },
)


def is_extension_key(path: KeyPath) -> bool:
    """Top-level ``x-...`` keys are free-form (for tools built on tracr) and never checked."""
    return len(path) == 1 and isinstance(path[0], str) and path[0].startswith("x-")


def _type_ok(kind: str, v: Any) -> bool:
    if kind == "any":
        return True
    if kind == "str":
        return isinstance(v, str)
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "map":
        return isinstance(v, dict)
    if kind == "list":
        return isinstance(v, list)
    raise ValueError(kind)


def _describe(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"{str(v).lower()} (a boolean)"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    kind = {str: "a string", int: "an integer", float: "a number"}.get(type(v), type(v).__name__)
    return f"{v!r} ({kind})"


def fill_defaults(value: Any, f: Field = SCHEMA) -> Any:
    """Add every missing optional key, leniently: wrong shapes are left for :func:`validate`."""
    if value is None and f.default is not REQUIRED and f.default is not None:
        return f.default_value()
    if f.pre is not None:
        value = f.pre(value)
    if f.kind == "map" and isinstance(value, dict):
        for key, sub in (f.keys or {}).items():
            if key not in value:
                if sub.default is not REQUIRED:
                    value[key] = sub.default_value()
            else:
                value[key] = fill_defaults(value[key], sub)
        if f.values is not None:
            for key in value:
                if not (f.keys and key in f.keys):
                    value[key] = fill_defaults(value[key], f.values)
    elif f.kind == "list" and isinstance(value, list) and f.items is not None:
        for i, item in enumerate(value):
            value[i] = fill_defaults(item, f.items)
    return value


def validate(value: Any, f: Field = SCHEMA, path: KeyPath = ()) -> Any:
    """Check ``value`` against ``f``; return it normalised (shorthands expanded, floats kept).

    Raises :class:`SchemaProblem` at the first problem.
    """
    if f.pre is not None:
        value = f.pre(value)
    if value is None:
        if f.nullable:
            return None
        if f.kind == "map" and f.default is not REQUIRED and f.default is not None:
            value = f.default_value()  # "partitioner:" with nothing under it
        else:
            raise SchemaProblem(path, f"must be {_TYPE_WORDS.get(f.kind, f.kind)}, not null")
    if not _type_ok(f.kind, value):
        raise SchemaProblem(
            path, f"must be {_TYPE_WORDS.get(f.kind, f.kind)}, not {_describe(value)}"
        )
    if f.choices is not None and value not in f.choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in f.choices], n=1)
        msg = f"'{value}' is not allowed."
        if close:
            msg += f" Did you mean '{close[0]}'?"
        msg += f" The valid options are [{', '.join(map(str, f.choices))}]."
        raise SchemaProblem(path, msg)
    if f.min is not None and value < f.min:
        raise SchemaProblem(path, f"must be >= {f.min:g}, got {value}")
    if f.max is not None and value > f.max:
        raise SchemaProblem(path, f"must be <= {f.max:g}, got {value}")
    if f.check is not None:
        problem = f.check(value)
        if problem:
            raise SchemaProblem(path, problem)
    if f.kind == "map":
        return _validate_map(value, f, path)
    if f.kind == "list" and f.items is not None:
        return [validate(item, f.items, path + (i,)) for i, item in enumerate(value)]
    return value


def _validate_map(value: dict, f: Field, path: KeyPath) -> dict:
    out: dict = {}
    keys = f.keys or {}
    for key, sub in value.items():
        if not isinstance(key, str):
            raise SchemaProblem(path + (key,), f"keys must be strings, not {_describe(key)}")
        if key in keys:
            out[key] = validate(sub, keys[key], path + (key,))
        elif f.values is not None:
            out[key] = validate(sub, f.values, path + (key,))
        elif f.open or is_extension_key(path + (key,)):
            out[key] = sub
        else:
            valid = list(keys)
            close = difflib.get_close_matches(key, valid, n=1)
            msg = f"unknown key '{key}'."
            if close:
                msg += f" Did you mean '{close[0]}'?"
            msg += f" Valid keys: {', '.join(valid)}."
            raise SchemaProblem(path + (key,), msg)
    for key, sub in keys.items():
        if key not in out:
            if sub.default is REQUIRED:
                raise SchemaProblem(
                    path + (key,), f"missing required key '{key}' ({sub.doc or sub.kind})"
                )
            out[key] = sub.default_value()
    # Schema order first, so `tracr experiment show` reads the same for every manifest.
    ordered = {k: out[k] for k in keys if k in out}
    ordered.update((k, v) for k, v in out.items() if k not in ordered)
    return ordered
