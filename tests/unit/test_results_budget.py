"""The latency budget (app_api.results.budget) and predictor accuracy (within 10%)."""

from __future__ import annotations

import pytest

from app_api.results.budget import TOLERANCE, from_stages, latency_budget, warmup_count
from app_api.results.scoring import within_share


def two_party(iid: int, gap: float = 0.0, mode: str = "latency") -> tuple[dict, list[dict]]:
    """An edge (hop 0) and a cloud (hop 1) whose times are on different clocks (the
    cloud's start 1e6 ms later): head compute 10, encode 2, send 1, then a ``gap`` before
    the send; the cloud decodes 1 before it stamps its arrival, waits 0.5, computes 20."""
    h0 = 100.0
    head = {"inference": iid, "config": "5", "mode": mode, "hop": 0, "instance": "edge-1",
            "t_start_ms": h0, "t_end_ms": h0 + 10, "encode_ms": 2, "send_ms": 1,
            "t_sent_ms": h0 + 10 + gap + 2 + 1, "decode_ms": ""}
    c0 = 1e6
    cloud = {"inference": iid, "config": "5", "mode": mode, "hop": 1, "instance": "cloud-1",
             "t_arrive_ms": c0, "decode_ms": 1, "t_start_ms": c0 + 0.5, "t_end_ms": c0 + 20.5,
             "encode_ms": "", "send_ms": "", "t_sent_ms": ""}
    wire_out, wire_back = 4.0, 3.0
    e2e = 10 + gap + 2 + 1 + wire_out + 1 + 0.5 + 20 + wire_back
    row = {"inference": iid, "split": 5, "e2e_ms": e2e, "edge_ms": 10, "encode_ms": 2,
           "decode_ms": 1, "cloud_ms": 20, "transfer_ms": e2e - 33, "error": ""}
    return row, [head, cloud]


def test_the_parts_of_an_inference_add_up_and_only_one_clock_is_subtracted_at_a_time():
    row, stages = two_party(0)
    parts = from_stages(row["e2e_ms"], stages)
    assert parts == pytest.approx({"edge_ms": 10, "encode_ms": 2, "transfer_ms": 1 + 4 + 3,
                                   "decode_ms": 1, "cloud_ms": 20, "queue_ms": 0.5,
                                   "held_ms": 0.0, "cpu_wait_ms": 0.0})
    b = latency_budget([row], stages)
    assert b["source"] == "stages" and b["adds_up"] and b["worst_residual_pct"] < 1e-9


def test_time_no_timer_holds_is_the_residual_and_is_reported_as_the_worst():
    rows, stages = [], []
    for i, gap in enumerate((0.0, 0.1, 3.0)):
        r, s = two_party(i, gap)
        rows.append(r)
        stages += s
    b = latency_budget(rows, stages)
    worst = 3.0 / rows[2]["e2e_ms"]
    assert b["worst_inference"] == "2"
    assert b["worst_residual_pct"] == pytest.approx(100 * worst)
    assert worst > TOLERANCE and b["over_tolerance"] == 1 and not b["adds_up"]


def test_the_part_of_a_hand_off_the_lab_pacer_held_its_host_is_held_not_residual():
    """A 3 ms hand-off on the head (a 3-stage lab pipeline's worst residuals, 3-5% of e2e,
    were such a hand-off) of which the pacer's record has the head's host stopped 2.7 ms:
    2.7 ms is ``held_ms``. Holds in the compute, of another host, or before the record
    begins are not."""
    row, stages = two_party(0, gap=3.0)
    end = 110.0  # the head's compute end; its hand-off runs to 113
    holds = [{"instance": "", "host": "", "t_stop_ms": 50.0, "t_cont_ms": ""},
             {"instance": "edge-1", "host": "lab-1", "t_stop_ms": 102.0, "t_cont_ms": 105.0},
             {"instance": "edge-1", "host": "lab-1", "t_stop_ms": end + 0.2,
              "t_cont_ms": end + 2.9},
             {"instance": "cloud-1", "host": "lab-2", "t_stop_ms": end, "t_cont_ms": end + 3}]
    b = latency_budget([row], stages, holds)
    assert b["parts_ms_median"]["held_ms"] == pytest.approx(2.7)
    assert b["worst_residual_pct"] == pytest.approx(100 * 0.3 / row["e2e_ms"])
    assert b["adds_up"] and b["held"]["inferences_held"] == 1
    assert latency_budget([row], stages)["worst_residual_pct"] == pytest.approx(
        100 * 3.0 / row["e2e_ms"])  # without the record: all residual
    late = [{**holds[0], "t_stop_ms": 111.0}, *holds[1:]]  # the record begins mid-hand-off
    assert latency_budget([row], stages, late)["parts_ms_median"]["held_ms"] == 0.0


def test_the_part_of_a_hand_off_its_thread_waited_for_a_cpu_is_cpu_wait_not_residual():
    """A 3 ms hand-off on the head whose thread the kernel counts 1.9 ms on the run queue
    (a host continued by the pacer, or sharing its CPU, waits there): 1.9 ms is
    ``cpu_wait_ms``. Beside a pacer's hold of 2 ms in the same hand-off it is capped at what
    the hold leaves (a stopped thread is off the run queue); a row without the figure (a
    run recorded before it was, a kernel without schedstat) leaves the residual as it was."""
    row, (head, cloud) = two_party(0, gap=3.0)
    b = latency_budget([row], [{**head, "cpu_wait_ms": 1.9}, cloud])
    assert b["parts_ms_median"]["cpu_wait_ms"] == pytest.approx(1.9)
    assert b["worst_residual_pct"] == pytest.approx(100 * 1.1 / row["e2e_ms"])
    assert b["cpu_wait"]["inferences_waited"] == 1
    holds = [{"instance": "", "host": "", "t_stop_ms": 50.0, "t_cont_ms": ""},
             {"instance": "edge-1", "host": "lab-1", "t_stop_ms": 110.5, "t_cont_ms": 112.5}]
    b = latency_budget([row], [{**head, "cpu_wait_ms": 1.9}, cloud], holds)
    assert b["parts_ms_median"]["held_ms"] == pytest.approx(2.0)
    assert b["parts_ms_median"]["cpu_wait_ms"] == pytest.approx(1.0)
    assert b["worst_residual_pct"] == pytest.approx(0.0, abs=1e-9)
    assert latency_budget([row], [{**head, "cpu_wait_ms": ""}, cloud])[
        "worst_residual_pct"] == pytest.approx(100 * 3.0 / row["e2e_ms"])
    piped, (ph, pc) = two_party(1, gap=3.0, mode="throughput")  # there: the send thread's
    parts = from_stages(piped["e2e_ms"], [{**ph, "cpu_wait_ms": 1.9}, pc])
    assert parts["cpu_wait_ms"] == 0.0 and parts["queue_ms"] == pytest.approx(3.5)


def test_the_holds_file_rotates_and_both_files_are_read(tmp_path, monkeypatch):
    from app_api.lab import holds as holds_mod

    monkeypatch.setattr(holds_mod, "HOLDS_MAX_BYTES", 400)
    path = tmp_path / "holds"
    log = holds_mod.HoldLog(path, ["/sys/fs/cgroup/cpu/a", "/sys/fs/cgroup/cpu/b"])
    for k in range(30):
        log.add(k % 2, 1000.0 + k, 1000.5 + k)
        if k % 5 == 4:
            log.flush()
    dirs, spans = holds_mod.read_holds(path)
    assert path.with_name("holds.1").exists()
    assert dirs == {0: "/sys/fs/cgroup/cpu/a", 1: "/sys/fs/cgroup/cpu/b"}
    assert spans[-1] == (1, 1029.0, 1029.5) and spans == sorted(spans, key=lambda s: s[1])
    assert 10 <= len(spans) < 30  # the oldest went with the first rotation


def test_in_throughput_mode_waiting_for_the_send_thread_is_queue_wait():
    row, stages = two_party(0, gap=3.0, mode="throughput")
    parts = from_stages(row["e2e_ms"], stages)
    assert parts["queue_ms"] == pytest.approx(0.5 + 3.0)
    assert sum(parts.values()) == pytest.approx(row["e2e_ms"])


def test_a_three_stage_chain_counts_the_middle_stage_codec_and_its_send_as_transfer():
    row, (head, last) = two_party(0)
    mid = {"inference": 0, "config": "3/5", "mode": "latency", "hop": 1, "instance": "stage-1",
           "t_arrive_ms": 5e5, "decode_ms": 0.7, "t_start_ms": 5e5 + 0.2,
           "t_end_ms": 5e5 + 6.2, "encode_ms": 0.4, "send_ms": 0.3, "t_sent_ms": 5e5 + 6.9}
    last = {**last, "hop": 2}
    e2e = row["e2e_ms"] + 0.7 + 0.2 + 6 + 0.4 + 0.3 + 2.5  # the stage, and 2.5 more wire
    parts = from_stages(e2e, [head, mid, last])
    assert parts["cloud_ms"] == pytest.approx(20 + 6)
    assert parts["encode_ms"] == pytest.approx(2 + 0.4)
    assert parts["decode_ms"] == pytest.approx(1 + 0.7)
    assert parts["queue_ms"] == pytest.approx(0.5 + 0.2)
    assert parts["transfer_ms"] == pytest.approx(1 + 4 + 3 + 0.3 + 2.5)
    assert sum(parts.values()) == pytest.approx(e2e)


def test_without_stage_records_the_columns_are_summed_and_the_source_says_so():
    row, _ = two_party(0)
    b = latency_budget([row, {**row, "inference": 1, "error": "boom", "e2e_ms": ""}])
    assert b["source"] == "columns" and b["inferences"] == 1 and b["worst_residual_pct"] < 1e-9
    assert latency_budget([]) is None


def test_warm_up_is_counted():
    assert warmup_count(2, 23)["inferences"] == 4
    assert warmup_count(3, 1)["inferences"] == 3
    assert warmup_count(2, 23, configs=5)["inferences"] == 14


def test_within_share_is_the_share_of_predictions_within_ten_percent():
    assert within_share([100, 109, 111, 80], [100, 100, 100, 100]) == 0.5
    assert within_share([1.0], [0.0]) is None
    assert within_share([], []) is None
