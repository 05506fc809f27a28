"""The control protocol: messages round-trip, every exposed call uses @control, replies are
JSON, and the observer's client maps failures to errors that name the participant."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
import time

import pytest

from app_api.results import INFER_COLUMNS as STORE_INFER_COLUMNS
from app_api.runner.client import ParticipantClient, ParticipantLost
from experiment_design import protocol
from experiment_design.errors import TracrError
from experiment_design.protocol import (
    INFER_COLUMNS,
    Admission,
    AdmittedPartner,
    DataAddress,
    Environment,
    LinkProbe,
    Measurements,
    Message,
    PartitionerPlan,
    PartnerAddress,
    PollReply,
    PollRequest,
    ProfileParams,
    ProtocolError,
    SetupConfig,
    SetupInfo,
    TaskStart,
    TaskStarted,
    Warmup,
    WarmupDone,
    Wiring,
    partition_context,
)
from experiment_design.roles import ParticipantService, get_role
from experiment_design.runtime.control import control

EXAMPLES: list[Message] = [
    Environment(python="3.11.7", torch="2.4.1", tracr="0.1.0", role="edge", extra={"x": 1}),
    SetupConfig(instance="edge-1", model={"name": "alexnet"}, seed=3, data_secret="ab"),
    SetupInfo(mode="graph", n_layers=2, valid_splits=[0, 1, 2], partitioner_needs=["network"]),
    DataAddress(host="127.0.0.1", port=4000),
    Wiring({"downstream": [PartnerAddress(instance="cloud-1", host="10.0.0.2", port=4000)]}),
    Wiring({"chain": [PartnerAddress("cloud-1", "10.0.0.2", 4000, key="ab" * 32)]}),
    Admission([AdmittedPartner("edge-1", ["10.0.0.1"], "cd" * 32)]),
    ProfileParams(repeats=7, full_repeats=9),
    LinkProbe(),
    Warmup(rounds=2),
    WarmupDone(seconds=0.5),
    Measurements(network={"bandwidth_Bps": 1e6, "rtt_ms": 1.0}),
    PartitionerPlan(sweep_length=6, decision={"chosen": 2}),
    TaskStart(task="infer-dataset", params={"count": 3}),
    TaskStarted(started="infer-dataset"),
    PollRequest(wait_s=0.25),
    PollReply(state="done", records=[{"inference": 0, "error": ""}], logs=[{"msg": "hi"}]),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_json(msg):
    text = msg.to_json()
    assert isinstance(json.loads(text), dict)
    assert type(msg).from_json(text) == msg


def test_wire_forms_are_what_both_sides_always_sent():
    wiring = Wiring({"downstream": [PartnerAddress("cloud-1", "h", 1)]})
    assert json.loads(wiring.to_json()) == {
        "downstream": [{"instance": "cloud-1", "host": "h", "port": 1}]}
    assert json.loads(LinkProbe().to_json()) == {}
    assert json.loads(Measurements().to_json()) == {}
    assert json.loads(PartitionerPlan().to_json()) == {"sweep_length": None, "decision": None}
    assert Warmup.from_json("3") == Warmup(rounds=3)
    assert PollRequest.from_json("") == PollRequest()


def test_closed_messages_refuse_unknown_fields_and_open_ones_keep_them():
    with pytest.raises(ProtocolError, match="wait_sec"):
        PollRequest.from_json('{"wait_sec": 1}')
    with pytest.raises(ProtocolError, match="JSON object"):
        TaskStart.from_json("[1]")
    with pytest.raises(ProtocolError, match="task"):
        TaskStart.from_json("{}")
    info = SetupInfo.from_dict({"mode": "graph", "my_key": 1})
    assert info.extra == {"my_key": 1} and info.to_dict()["my_key"] == 1


def test_inference_columns_are_defined_once():
    from app_api.results import store

    assert STORE_INFER_COLUMNS is INFER_COLUMNS
    for name in ("INFER_COLUMNS", "LAYER_COLUMNS", "STAGE_COLUMNS", "CONFIG_COLUMNS"):
        assert getattr(store, name) is getattr(protocol, name), name
    assert protocol.STAGE_COLUMNS[:4] == ["inference", "config", "mode", "hop"]
    assert protocol.CONFIG_COLUMNS[:4] == ["config", "cuts", "chain", "mode"]
    assert INFER_COLUMNS[0] == "inference" and INFER_COLUMNS[-1] == "error"
    assert protocol.LAYER_COLUMNS == ["inference", "instance", "side", "index", "name", "type",
                                      "ms"]


def test_partition_context_is_model_facts_plus_measurements():
    info = SetupInfo(valid_splits=[0, 1], points=[{"index": 0}], profile=[{"name": "a"}])
    ctx = partition_context(info, Measurements(network={"rtt_ms": 1.0}))
    assert ctx == {"layers": [{"name": "a"}], "points": [{"index": 0}], "valid_splits": [0, 1],
                   "network": {"rtt_ms": 1.0}}


def _exposed(cls: type) -> list[str]:
    """tracr's exposed methods (rpyc.Service's own service-name queries aside)."""
    import rpyc

    return [n for n in dir(cls) if n.startswith("exposed_") and not hasattr(rpyc.Service, n)]


@pytest.mark.parametrize("role", ["edge", "cloud"])
def test_every_exposed_method_is_a_control_call_without_hand_written_plumbing(role):
    cls = get_role(role)
    for name in _exposed(cls):
        fn = getattr(cls, name)
        assert hasattr(fn, "request"), f"{name} is not decorated with @control"
        body = textwrap.dedent(inspect.getsource(fn.__wrapped__))
        calls = {ast.unparse(n.func) for n in ast.walk(ast.parse(body))
                 if isinstance(n, ast.Call)}
        assert not calls & {"self.touch", "json.loads", "json.dumps", "self._guard"}, name


def test_every_reply_is_a_json_document():
    svc = ParticipantService(instance="t")
    for name in ("heartbeat", "finish", "cancel", "data_address", "probe_link",
                 "prepare_partitioner", "poll"):
        json.loads(getattr(svc, f"exposed_{name}")())
    assert json.loads(svc.exposed_heartbeat()) == protocol.ACK


class _Boom(ParticipantService):
    @control(PollRequest)
    def exposed_boom(self, req: PollRequest) -> dict:
        raise ValueError(f"bad {req.wait_s}")


def test_control_maps_errors_and_counts_the_call_as_work():
    svc = _Boom(instance="edge-9")
    with pytest.raises(TracrError, match="edge-9: ValueError: bad 2"):
        svc.exposed_boom('{"wait_s": 2}')
    with pytest.raises(ProtocolError):
        svc.exposed_boom("{not json")
    with pytest.raises(ProtocolError, match="JSON string"):
        svc.exposed_boom({"wait_s": 1})  # a container would be an rpyc reference
    assert not svc.busy()


class _Handle:
    """A launched participant as the client sees it: the service behind a real
    authenticated rpyc connection on loopback (the client awaits calls asynchronously)."""

    host_label = "pi4"

    def __init__(self, svc, alive=True):
        import os
        import threading

        from experiment_design.runtime import connect_control
        from experiment_design.runtime.auth import control_server

        secret = os.urandom(32)
        self.server = control_server(svc, secret)
        threading.Thread(target=self.server.start, daemon=True).start()
        self.conn = connect_control("127.0.0.1", self.server.port, secret)
        self._alive = alive

    def alive(self):
        return self._alive

    def silent_for(self):
        return 0.0

    def stderr_tail(self, n=8):
        return "Killed"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.conn.close()
        self.server.close()


def test_client_calls_are_typed():
    with _Handle(ParticipantService(instance="edge-1")) as h:
        client = ParticipantClient("edge-1", h)
        assert isinstance(client.poll(0), PollReply) and client.poll(0).state == "idle"
        assert client.data_address() is None and client.probe_link() is None
        assert client.prepare_partitioner(Measurements()) is None
        client.heartbeat()
        client.finish()


def test_client_names_the_participant_host_and_call():
    with _Handle(_Boom(instance="edge-1")) as h:
        client = ParticipantClient("edge-1", h)
        with pytest.raises(TracrError,
                           match=r"edge-1 on pi4: boom\(\) failed: edge-1: ValueError"):
            client.call("boom", PollRequest())
    with _Handle(_Boom(instance="edge-1"), alive=False) as h:
        dead = ParticipantClient("edge-1", h)
        with pytest.raises(ParticipantLost, match=r"edge-1 on pi4 died during boom\(\)") as err:
            dead.call("boom", PollRequest())
        assert err.value.hint == "Killed"


class _Big(ParticipantService):
    @control()
    def exposed_big(self) -> dict:
        return {"rows": "x" * (32 << 20)}


def test_a_reply_slower_to_arrive_than_a_wait_slice_is_not_dropped():
    # rpyc drops a reply that lands on an AsyncResult whose expiry has passed. The client waits
    # in slices (to check liveness and Ctrl-C between them); a reply that took longer than a
    # slice to receive and unbox (a poll() carrying many rows, a loaded host) used to be
    # dropped, and the call then hung until its whole timeout (poll: 60 s, setup: 600 s).
    with _Handle(_Big(instance="edge-1")) as h:
        client = ParticipantClient("edge-1", h)
        t0 = time.monotonic()
        assert len(client.call("big", timeout=20)["rows"]) == 32 << 20
        assert time.monotonic() - t0 < 15


def test_setup_config_carries_typed_configs_in_the_wire_form_the_observer_always_sent():
    from experiment_design.protocol import DatasetConfig, ModelConfig, TransportConfig

    wire = {"instance": "edge-1",
            "model": {"name": "alexnet", "weights": None, "depth": None, "mode": "auto",
                      "batch": 1},
            "seed": 0, "dataset": {"name": "sample", "params": {"limit": 2}},
            "transport": {"codec": "zstd", "level": 1, "filter": "shuffle", "encrypt": False,
                          "lossy": "none", "granularity": "tensor", "quality": 90},
            "partitioner": {"name": "cyclic", "params": {}}, "data_secret": ""}
    config = SetupConfig.from_dict(wire)
    assert isinstance(config.model, ModelConfig) and config.model.name == "alexnet"
    assert config.dataset == DatasetConfig("sample", {"limit": 2})
    assert isinstance(config.transport, TransportConfig) and config.partitioner.name == "cyclic"
    assert config.to_dict() == wire
    # a caller may still hand a nested config as its mapping
    assert SetupConfig(model={"name": "alexnet"}).model == ModelConfig(name="alexnet")
    with pytest.raises(ProtocolError, match="ModelConfig"):
        SetupConfig.from_dict({"model": {"name": "alexnet", "colour": "red"}})


def test_the_run_and_pipeline_sections_travel_typed_in_the_wire_form_they_always_had():
    from app_api.manifest import load_manifest
    from experiment_design.protocol import PipelineConfig, RunConfig

    m = load_manifest("alexnet-pipeline", ["run.repeats=3", "pipeline.queue=5"])
    config = SetupConfig(run=dict(m.run), pipeline=m.pipeline)  # as deploy builds it
    assert config.run == RunConfig(repeats=3) and config.pipeline.queue == 5
    assert config.pipeline == PipelineConfig(chain=["edge-1", "stage-1", "cloud-1"],
                                             modes=["throughput", "latency"], count=24,
                                             in_flight=3, queue=5)
    # the wire form is the manifest's section, as when it travelled as a mapping
    assert config.to_dict()["run"] == dict(m.run) and config.to_dict()["pipeline"] == m.pipeline
    assert SetupConfig.from_json(config.to_json()) == config
    assert SetupConfig().run is None and SetupConfig().pipeline is None
    with pytest.raises(ProtocolError, match="RunConfig"):
        SetupConfig.from_dict({"run": {"warmup": 1, "colour": "red"}})


@pytest.mark.parametrize("role", ["edge", "cloud", "stage", "llm-head", "llm-stage"])
def test_every_exposed_call_is_in_the_protocols_call_table_and_the_client(role):
    table = protocol.__doc__.split("\n    call ", 1)[1].split("\n\n", 1)[0]
    for name in _exposed(get_role(role)):
        call = name.removeprefix("exposed_")
        assert f"{call}(" in table, f"{call}() is missing from the call table"
        assert callable(getattr(ParticipantClient, call, None)), f"no client method {call}()"
