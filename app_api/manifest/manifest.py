"""The :class:`Manifest` (a validated experiment) and :func:`load_manifest`."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from app_api import plugins
from app_api.manifest import names
from app_api.manifest.errors import KeyPath, ManifestError, format_path
from app_api.manifest.overrides import Override, apply_one, parse_overrides
from app_api.manifest.schema import SchemaProblem, fill_defaults, validate
from app_api.manifest.search import find_manifest
from app_api.manifest.yamlio import load_yaml_file
from experiment_design.errors import TracrError, UnknownNameError


class Manifest:
    """A validated, resolved experiment (defaults filled, overrides applied); read-only.

    Section properties return copies, so a caller may change what it gets
    without changing the manifest. ``parsed_overrides`` are the :class:`Override`
    objects applied, in order; ``overrides`` the same as written (what run records keep).
    """

    __slots__ = ("name", "path", "parsed_overrides", "_data")

    def __init__(
        self, name: str, path: Path | None, data: dict, overrides: Iterable[Override | str] = ()
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "parsed_overrides", parse_overrides(overrides))
        object.__setattr__(self, "_data", data)

    @property
    def overrides(self) -> list[str]:
        """The overrides as written on the command line, in order (a copy)."""
        return [o.text for o in self.parsed_overrides]

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("Manifest is read-only; load it again with overrides instead")

    def _section(self, key: str) -> Any:
        return copy.deepcopy(self._data[key])

    @property
    def raw(self) -> dict:
        """The whole resolved manifest as a plain dict (a copy)."""
        return copy.deepcopy(self._data)

    description = property(lambda self: self._data["description"], doc="One-line description.")
    model = property(lambda self: self._section("model"), doc="{name, weights, depth, mode, batch}")
    participant_types = property(
        lambda self: self._section("participant_types"),
        doc="type -> {role, model (None: the top-level model), settings: {threads, ...}}",
    )
    participant_instances = property(
        lambda self: self._section("participant_instances"), doc="[{name, type, device}]"
    )
    playbook = property(lambda self: self._section("playbook"), doc="instance -> [{task, params}]")
    partitioner = property(lambda self: self._section("partitioner"), doc="{name, params}")
    dataset = property(lambda self: self._section("dataset"), doc="{name, params}")
    transport = property(lambda self: self._section("transport"), doc="{codec, level, filter}")
    run = property(lambda self: self._section("run"), doc="{warmup, repeats, seed, timeout_s}")
    network = property(
        lambda self: self._section("network"),
        doc="{bandwidth, bandwidths, delay_ms, jitter_ms, loss_pct} (lab link shaping)",
    )
    evaluate = property(lambda self: self._section("evaluate"), doc="{partitioners: [names]}")
    lab = property(
        lambda self: self._section("lab"),
        doc="{hosts, cpu, cpu_mode, cpu_period_ms, pin, on_mismatch} or None (the lab needed)",
    )
    pipeline = property(
        lambda self: self._section("pipeline"),
        doc="{chain, modes, count, in_flight, queue, baselines} (chains of stages)",
    )

    def instance(self, name: str) -> dict:
        """``{name, type, device}`` of instance ``name``."""
        for inst in self._data["participant_instances"]:
            if inst["name"] == name:
                return copy.deepcopy(inst)
        raise KeyError(name)

    def role_of(self, instance: str) -> str:
        """The role an instance plays."""
        return self._data["participant_types"][self.instance(instance)["type"]]["role"]

    def settings_of(self, instance: str) -> dict:
        """Per-role settings (``threads``, ...) of an instance."""
        return copy.deepcopy(
            self._data["participant_types"][self.instance(instance)["type"]]["settings"]
        )

    def model_for(self, instance: str) -> str:
        """The model name an instance runs: its type's ``model`` or the top-level one."""
        ptype = self._data["participant_types"][self.instance(instance)["type"]]
        return ptype.get("model") or self._data["model"]["name"]

    def to_yaml(self) -> str:
        """The resolved manifest as YAML (what ``tracr experiment show`` prints)."""
        return yaml.safe_dump(self._data, sort_keys=False, default_flow_style=False, width=100)

    def __repr__(self) -> str:
        return f"<Manifest {self.name!r} from {self.path}>"


class _Locator:
    """Turns a key path into ``file:line`` and notes keys that came from overrides."""

    def __init__(self, file: str, lines: dict[KeyPath, int], touched: dict[KeyPath, str]):
        self.file, self.lines, self.touched = file, lines, touched

    def error(self, path: KeyPath, message: str, hint: str | None = None) -> ManifestError:
        for n in range(len(path), 0, -1):
            if path[:n] in self.touched:
                message += f" (set by override '{self.touched[path[:n]]}')"
                return ManifestError(message, file=self.file, key=format_path(path), hint=hint)
        line = None
        for n in range(len(path), 0, -1):
            if path[:n] in self.lines:
                line = self.lines[path[:n]]
                break
        return ManifestError(message, file=self.file, key=format_path(path), line=line, hint=hint)


def _unknown(kind: str, name: str, valid: Iterable[str]) -> str:
    return UnknownNameError(kind, name, valid).message


def _check_names(d: dict, loc: _Locator) -> None:
    """Cross-references inside the manifest and names against the registries."""
    types, instances, playbook = d["participant_types"], d["participant_instances"], d["playbook"]
    try:
        plugins.activate(d.get("plugins") or [])
    except TracrError as exc:
        raise loc.error(("plugins",), exc.message, hint=exc.hint) from exc
    if not types:
        raise loc.error(("participant_types",), "defines no participant types")
    if not instances:
        raise loc.error(("participant_instances",), "lists no participants")

    roles = names.roles()
    for tname, spec in types.items():
        if spec["role"] not in roles:
            raise loc.error(
                ("participant_types", tname, "role"), _unknown("role", spec["role"], roles)
            )

    _check_model(d["model"]["name"], ("model", "name"), loc)
    for tname, spec in types.items():
        if spec.get("model"):
            _check_model(spec["model"], ("participant_types", tname, "model"), loc)

    seen: dict[str, int] = {}
    devices: list[str] | None = None  # the device registry is read only when needed
    for i, inst in enumerate(instances):
        if inst["name"] in seen:
            raise loc.error(
                ("participant_instances", i, "name"),
                f"instance name '{inst['name']}' is used twice (also item {seen[inst['name']]})",
            )
        seen[inst["name"]] = i
        if inst["type"] not in types:
            raise loc.error(
                ("participant_instances", i, "type"),
                _unknown("participant type", inst["type"], types),
                hint="Types are the keys of participant_types.",
            )
        if inst["device"] != names.LOCALHOST:
            devices = devices if devices is not None else names.devices()
            if inst["device"] not in devices:
                raise loc.error(
                    ("participant_instances", i, "device"),
                    _unknown("device", inst["device"], devices),
                    hint="Pair the device first (`tracr device pair NAME ...`); lab-N devices "
                    "exist while the emulated lab is up (`tracr lab up`). `tracr device ls` lists them.",
                )

    for inst_name in playbook:
        if inst_name not in seen:
            raise loc.error(
                ("playbook", inst_name),
                _unknown("participant instance", inst_name, seen),
                hint="Playbook keys are the names in participant_instances.",
            )
    tasks = names.tasks()
    for inst_name in seen:
        if inst_name not in playbook:
            raise loc.error(
                ("playbook",),
                f"instance '{inst_name}' has no playbook entry",
                hint=f"Add e.g. `{inst_name}: [{{task: wait}}]` under playbook.",
            )
        if not playbook[inst_name]:
            raise loc.error(("playbook", inst_name), "has no tasks (give it at least [wait])")
        for j, step in enumerate(playbook[inst_name]):
            if step["task"] not in tasks:
                raise loc.error(
                    ("playbook", inst_name, j, "task"), _unknown("task", step["task"], tasks)
                )

    chain = (d.get("pipeline") or {}).get("chain")
    if chain is not None:
        if len(chain) < 2:
            raise loc.error(("pipeline", "chain"), "a chain needs at least two participants")
        for j, inst_name in enumerate(chain):
            if inst_name not in seen:
                raise loc.error(("pipeline", "chain", j),
                                _unknown("participant instance", inst_name, seen))
            if chain.index(inst_name) != j:
                raise loc.error(("pipeline", "chain", j), f"'{inst_name}' is in the chain twice")

    parts = names.partitioners()
    if d["partitioner"]["name"] not in parts:
        raise loc.error(
            ("partitioner", "name"), _unknown("partitioner", d["partitioner"]["name"], parts)
        )
    for key, problem in names.param_problems("partitioner", d["partitioner"]["name"],
                                             d["partitioner"]["params"]):
        raise loc.error(("partitioner", "params", key), problem,
                        hint=f"partitioner '{d['partitioner']['name']}' declares its parameters "
                        "in its PARAMS; the manifest reference lists the built-in ones")
    for j, pname in enumerate(d["evaluate"]["partitioners"]):
        if pname not in parts:
            raise loc.error(("evaluate", "partitioners", j), _unknown("partitioner", pname, parts))

    datasets = names.datasets()
    ds = d["dataset"]["name"]
    if ds not in datasets:
        raise loc.error(("dataset", "name"), _unknown("dataset", ds, datasets))
    for key in names.dataset_required_params(ds):
        if key not in d["dataset"]["params"]:
            raise loc.error(
                ("dataset", "params"),
                f"dataset '{ds}' needs params.{key}",
                hint=f"e.g. --set +dataset.params.{key}=...",
            )
    for key, problem in names.param_problems("dataset", ds, d["dataset"]["params"]):
        raise loc.error(("dataset", "params", key), problem)
    accepted = names.dataset_params(ds)
    if accepted is not None:  # None: the dataset takes any parameter
        for key in d["dataset"]["params"]:
            if key not in accepted:
                raise loc.error(
                    ("dataset", "params", key),
                    _unknown(f"{ds} dataset parameter", key, accepted),
                )


def _check_model(name: str, path: KeyPath, loc: _Locator) -> None:
    if name.startswith(names.TORCHVISION_PREFIX):
        tv = names.torchvision_models()
        short = name[len(names.TORCHVISION_PREFIX) :]
        if tv is not None and short not in tv:
            raise loc.error(path, _unknown("torchvision model", short, tv))
        return
    models = names.models()
    if name not in models:
        raise loc.error(
            path,
            _unknown("model", name, models),
            hint="Any torchvision classification model works as torchvision:<name>.",
        )


def validate_data(
    data: Any,
    *,
    name: str = "manifest",
    path: Path | None = None,
    file: str | None = None,
    lines: dict[KeyPath, int] | None = None,
    touched: dict[KeyPath, str] | None = None,
    overrides: Iterable[Override | str] = (),
) -> Manifest:
    """Validate an already-parsed manifest dict (defaults are filled) and wrap it."""
    file = file or (str(path) if path is not None else name)
    loc = _Locator(file, lines or {}, touched or {})
    if data is None:
        raise ManifestError("the manifest is empty", file=file)
    if not isinstance(data, dict):
        raise ManifestError("the top level must be a mapping of sections", file=file, line=1)
    data = fill_defaults(copy.deepcopy(data))
    try:
        resolved = validate(data)
    except SchemaProblem as p:
        raise loc.error(p.path, p.message, p.hint) from None
    _check_names(resolved, loc)
    return Manifest(name, path, resolved, overrides)


def load_manifest(name_or_path: str, overrides: Iterable[Override | str] = ()) -> Manifest:
    """Find, parse, override and validate a manifest; raise one :class:`ManifestError` if wrong.

    ``overrides`` are :class:`Override` objects (texts are parsed here, once).
    """
    overrides = parse_overrides(overrides)
    path = find_manifest(str(name_or_path))
    label = _label(path)
    data, lines = load_yaml_file(path, label)
    if data is None:
        raise ManifestError("the manifest is empty", file=label)
    if not isinstance(data, dict):
        raise ManifestError("the top level must be a mapping of sections", file=label, line=1)
    # Defaults first, so that `--set network.bandwidth=4MB/s` works when the file omits it.
    data = fill_defaults(data)
    touched = _apply(data, overrides, label, lines)
    return validate_data(
        data, name=path.stem, path=path, file=label, lines=lines, touched=touched,
        overrides=overrides,
    )  # fmt: skip


def derive_manifest(manifest: Manifest, overrides: Iterable[Override | str]) -> Manifest:
    """``manifest`` with more overrides applied and validated again, without reading its file.

    A bandwidth sweep plans one manifest per rate this way from the one it loaded.
    """
    extra = parse_overrides(overrides)
    label = _label(manifest.path) if manifest.path is not None else manifest.name
    data = manifest.raw
    touched = _apply(data, extra, label, None)
    return validate_data(
        data, name=manifest.name, path=manifest.path, file=label, touched=touched,
        overrides=(*manifest.parsed_overrides, *extra),
    )  # fmt: skip


def _apply(
    data: dict, overrides: Iterable[Override], label: str, lines: dict[KeyPath, int] | None
) -> dict[KeyPath, str]:
    """Apply ``overrides`` in place; the key paths they set (for errors that name them)."""
    touched: dict[KeyPath, str] = {}
    for override in overrides:
        try:
            apply_one(data, override, touched, lines)
        except ManifestError as exc:
            raise ManifestError(exc.problem, file=label, hint=exc.hint) from None
    return touched


def _label(path: Path) -> str:
    """How errors name the file: relative to the current directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
