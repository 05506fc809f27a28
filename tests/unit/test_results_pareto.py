"""configs.csv (written, read back typed), Pareto fronts per (bandwidth, batch), `tracr results
pareto` and plots/pareto.png."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import app
from app_api.results import (
    CONFIG_COLUMNS,
    CONFIGS_FILE,
    OBJECTIVES,
    RunWriter,
    pareto_front,
    parse_objectives,
    read_configs,
    read_csv,
)
from experiment_design.errors import TracrError, UnknownNameError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def row(cuts, lat, thr, nbytes=1000.0, mode="throughput", bw="4MB/s", batch=1, errors=0, n=10):
    """A typed configs.csv row as read_configs returns it."""
    return {"config": "/".join(map(str, cuts)), "cuts": list(cuts),
            "chain": ["edge", "mid", "cloud"], "mode": mode, "bandwidth": bw, "batch": batch,
            "in_flight": 4, "inferences": n, "items": n, "errors": errors,
            "throughput_per_s": thr, "items_per_s": thr, "latency_ms_p50": lat,
            "latency_ms_p95": lat, "latency_ms_mean": lat, "bound_per_s": thr,
            "bytes_per_inference": nbytes, "predicted_throughput_per_s": None,
            "predicted_latency_ms": None}


def configs(front_rows) -> list[str]:
    """``config mode`` of each row: what a reader of the table sees."""
    return [f"{r['config']} {r['mode']}" for r in front_rows]


# --- pareto_front on hand-made rows ---------------------------------------------------------

def test_dominated_points_are_removed_and_the_front_sorted_by_the_first_objective():
    rows = [row([8], 10.0, 50.0), row([9], 20.0, 40.0), row([4], 5.0, 30.0), row([12], 30.0, 60.0)]
    [g] = pareto_front(rows, "latency,throughput")
    assert configs(g.front) == ["4 throughput", "8 throughput", "12 throughput"]
    assert [r["config"] for r in g.points] == ["4", "8", "9", "12"]
    assert g.on_front == [True, True, False, True]
    [g] = pareto_front(rows, ["throughput", "latency"])  # best first: highest throughput
    assert configs(g.front) == ["12 throughput", "8 throughput", "4 throughput"]


def test_ties_are_kept_and_an_equal_value_does_not_protect_a_worse_point():
    rows = [row([8], 10.0, 50.0), row([9], 10.0, 50.0), row([10], 10.0, 40.0),
            row([11], 12.0, 50.0)]
    [g] = pareto_front(rows, ("latency", "throughput"))
    assert configs(g.front) == ["8 throughput", "9 throughput"]


def test_a_third_objective_keeps_a_point_that_two_would_drop():
    rows = [row([8], 10.0, 50.0, nbytes=9000.0), row([30], 20.0, 40.0, nbytes=100.0)]
    [g] = pareto_front(rows, "latency,throughput")
    assert configs(g.front) == ["8 throughput"]
    [g] = pareto_front(rows, "latency,throughput,bytes")
    assert configs(g.front) == ["8 throughput", "30 throughput"]
    [g] = pareto_front(rows, "bytes")
    assert configs(g.front) == ["30 throughput"]


def test_modes_are_two_points_of_one_group():
    rows = [row([8, 40], 12.0, 20.0, mode="latency"), row([8, 40], 30.0, 55.0, mode="throughput"),
            row([8, 30], 35.0, 50.0, mode="throughput")]
    [g] = pareto_front(rows)
    assert configs(g.front) == ["8/40 latency", "8/40 throughput"]


def test_groups_per_bandwidth_and_batch_never_compare_across():
    rows = [row([8], 50.0, 10.0, bw="4MB/s"), row([8], 5.0, 90.0, bw="64MB/s"),
            row([9], 60.0, 5.0, bw="4MB/s"), row([8], 4.0, 99.0, bw=None),
            row([8], 3.0, 200.0, bw="4MB/s", batch=8), row([7], 40.0, 20.0, bw="1MB/s")]
    groups = pareto_front(rows)
    assert [(g.bandwidth, g.batch) for g in groups] == [
        ("1MB/s", 1), ("4MB/s", 1), ("4MB/s", 8), ("64MB/s", 1), (None, 1)]
    assert [g.label for g in groups][-1] == "unshaped, batch 1"
    by = {(g.bandwidth, g.batch): g for g in groups}
    assert configs(by[("4MB/s", 1)].front) == ["8 throughput"]  # not beaten by 64MB/s or batch 8
    assert configs(by[("4MB/s", 1)].points) == ["8 throughput", "9 throughput"]
    assert pareto_front([row([8], 1.0, 1.0, bw="")])[0].bandwidth is None  # "" is unshaped too


def test_rows_without_values_or_with_every_inference_failed_are_excluded_and_reported():
    rows = [row([1], 10.0, 50.0), row([2], None, 90.0), row([3], 1.0, 99.0, errors=10, n=10),
            row([4], 11.0, 60.0, errors=3, n=10), row([5], math.nan, 95.0),
            row([6], 1.0, 99.0, n=0), row([7], 20.0, 70.0, nbytes=None)]
    [g] = pareto_front(rows, "latency,throughput")
    assert configs(g.front) == ["1 throughput", "4 throughput", "7 throughput"]  # 3 of 10 failed
    reasons = {r["config"]: why for r, why in g.excluded}
    assert reasons == {"2": "no value for latency_ms_p50", "3": "all 10 inferences failed",
                       "5": "no value for latency_ms_p50", "6": "no inferences"}
    [g] = pareto_front(rows, "latency,throughput,bytes")
    assert {r["config"]: why for r, why in g.excluded}["7"] == "no value for bytes_per_inference"


def test_objectives_are_checked():
    assert parse_objectives(" Latency, bytes,latency,") == ("latency", "bytes")
    with pytest.raises(UnknownNameError, match="Did you mean 'latency'") as e:
        parse_objectives("latncy,throughput")
    assert e.value.exit_code == 2
    with pytest.raises(TracrError, match="no objectives"):
        pareto_front([], ",")


# --- property: the front is exactly the non-dominated set -----------------------------------

def _oriented(r: dict, objectives) -> tuple[float, ...]:
    """Written independently of the module: lower is better in every coordinate."""
    out = []
    for o in objectives:
        col, sign, _ = OBJECTIVES[o]
        out.append(r[col] if sign > 0 else -r[col])
    return tuple(out)


def _beats(a: tuple, b: tuple) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=True)) and a != b


# few distinct values, so that ties and equal coordinates are common
values = st.one_of(st.none(), st.just(math.nan), st.integers(0, 6).map(float), st.floats(0, 100))
rows_strategy = st.lists(
    st.builds(lambda cut, lat, thr, nb, bw, batch, mode, err: row(
        [cut], lat, thr, nbytes=nb, bw=bw, batch=batch, mode=mode, errors=err, n=4),
        st.integers(0, 30), values, values, values, st.sampled_from(["1MB/s", "4MB/s", None]),
        st.sampled_from([1, 4]), st.sampled_from(["throughput", "latency"]),
        st.sampled_from([0, 0, 0, 2, 4])),
    max_size=40)
objective_lists = st.lists(st.sampled_from(sorted(OBJECTIVES)), min_size=1, max_size=3,
                           unique=True)


@settings(max_examples=300, deadline=None, database=None)
@given(rows=rows_strategy, objectives=objective_lists)
def test_front_is_exactly_the_non_dominated_rows(rows, objectives):
    groups = pareto_front(rows, objectives)
    seen = 0
    for g in groups:
        members = g.points + [r for r, _ in g.excluded]
        seen += len(members)
        assert all((r["bandwidth"], r["batch"]) == (g.bandwidth, g.batch) for r in members)
        for r, _ in g.excluded:  # excluded only for a reason the rules name
            assert r["errors"] >= r["inferences"] or not all(
                r[OBJECTIVES[o][0]] is not None and math.isfinite(r[OBJECTIVES[o][0]])
                for o in objectives)
        vecs = [_oriented(r, objectives) for r in g.points]
        front = [v for v, f in zip(vecs, g.on_front, strict=True) if f]
        for v in front:
            assert not any(_beats(w, v) for w in vecs)
        for v, f in zip(vecs, g.on_front, strict=True):
            if not f:
                assert any(_beats(w, v) for w in front)
        assert [v[0] for v in vecs] == sorted(v[0] for v in vecs)  # best first
    assert seen == len(rows)


# --- configs.csv: written by the run writer, read back typed --------------------------------

def written_run(tmp_path, rows=None):
    """A real run directory with configs.csv (and summary.json, as a finished run has)."""
    w = RunWriter("pipe", out_dir=tmp_path / "run")
    w.add_configs(rows if rows is not None else [
        {**row([8, 40], 12.0, 20.0, mode="latency"), "in_flight": 1},
        row([8, 40], 30.0, 55.0, nbytes=2048.0),
        row([8, 30], 35.0, 50.0),
        {**row([4, 30], 9.0, 70.0, bw="16MB/s"), "predicted_latency_ms": 8.5,
         "predicted_throughput_per_s": 72.0},
        row([4, 20], None, 1.0, errors=10, n=10),
    ])
    w.close()
    w.write_json("summary.json", {"experiment": "pipe", "run_id": w.run_id, "status": "ok"})
    return w.dir


def test_configs_round_trip_typed(tmp_path):
    run = written_run(tmp_path)
    assert list(read_csv(run / CONFIGS_FILE)[0]) == CONFIG_COLUMNS
    raw = read_csv(run / CONFIGS_FILE)[0]
    assert raw["cuts"] == "8;40" and raw["chain"] == "edge;mid;cloud" and raw["config"] == "8/40"
    back = read_configs(run)
    assert len(back) == 5 and read_configs(run / CONFIGS_FILE) == back
    first = back[0]
    assert first["cuts"] == [8, 40] and first["chain"] == ["edge", "mid", "cloud"]
    assert first["config"] == "8/40" and first["mode"] == "latency" and first["in_flight"] == 1
    assert isinstance(first["batch"], int) and isinstance(first["latency_ms_p50"], float)
    assert first["predicted_latency_ms"] is None and back[3]["predicted_latency_ms"] == 8.5
    assert back[1]["bytes_per_inference"] == 2048.0 and back[4]["latency_ms_p50"] is None
    groups = pareto_front(back)
    assert [g.bandwidth for g in groups] == ["4MB/s", "16MB/s"]
    assert configs(groups[0].front) == ["8/40 latency", "8/40 throughput"]


def test_an_unshaped_bandwidth_and_no_cut_read_back_as_none_and_unsplit(tmp_path):
    run = written_run(tmp_path, [{**row([], 3.0, 300.0, mode="single", bw=""), "config": None}])
    [r] = read_configs(run)
    assert r["bandwidth"] is None and r["cuts"] == [] and r["config"] == "unsplit"


def test_rows_are_on_disk_before_close_and_a_torn_last_row_is_dropped(tmp_path):
    w = RunWriter("pipe", out_dir=tmp_path / "run")
    assert not (w.dir / CONFIGS_FILE).exists()  # only a pipeline sweep gets one
    w.add_configs([row([8], 10.0, 50.0)])
    w.add_configs([row([9], 11.0, 40.0)])
    assert [r["config"] for r in read_configs(w.dir)] == ["8", "9"]
    w.close()
    with open(w.dir / CONFIGS_FILE, "a") as f:
        f.write("10,10,edge;cloud,throughput,,1,4,10")  # a kill mid-row: no newline
    assert [r["config"] for r in read_configs(w.dir)] == ["8", "9"]


def test_text_cells_are_formula_escaped(tmp_path):
    run = written_run(tmp_path, [{**row([8], 10.0, 50.0, bw="=HYPERLINK(1)"),
                                  "chain": ["@edge", "cloud"]}])
    raw = read_csv(run / CONFIGS_FILE)[0]
    assert raw["bandwidth"] == "'=HYPERLINK(1)" and raw["chain"] == "'@edge;cloud"
    assert raw["latency_ms_p50"] == "10.0"


def test_the_writer_refuses_what_would_be_a_silent_mistake(tmp_path):
    w = RunWriter("pipe", out_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="latency_p50"):
        w.add_configs([{**row([8], 10.0, 50.0), "latency_p50": 3.0}])
    with pytest.raises(ValueError, match="mode"):
        w.add_configs([row([8], 10.0, 50.0, mode="fast")])
    with pytest.raises(ValueError, match="not the label"):
        w.add_configs([{**row([8, 40], 10.0, 50.0), "config": "8-40"}])
    w.close()


def test_a_cell_that_is_not_a_number_names_its_line(tmp_path):
    run = written_run(tmp_path, [row([8], 10.0, 50.0), row([9], 10.0, 50.0)])
    text = (run / CONFIGS_FILE).read_text().replace("50.0", "fast", 1)
    (run / CONFIGS_FILE).write_text(text)
    with pytest.raises(TracrError, match=r"configs.csv:2: throughput_per_s 'fast' is not a number"):
        read_configs(run)


# --- tracr results pareto --------------------------------------------------------------------

def tracr(*argv: str) -> int:
    return app.main(list(argv))


def test_cli_prints_the_front_per_group_and_draws_the_plot(tmp_path, capsys):
    run = written_run(tmp_path)
    assert tracr("results", "pareto", str(run)) == 0
    out = capsys.readouterr().out
    assert "4MB/s, batch 1: 2 of 3 configurations on the front" in out
    assert "16MB/s, batch 1: 1 of 1" in out
    assert "8/40" in out and "8/30" not in out  # dominated: only with --all
    assert "left out: 4/20 throughput (edge;mid;cloud): all 10 inferences failed" in out
    png = run / "plots" / "pareto.png"
    assert png.read_bytes().startswith(PNG_MAGIC) and f"plot: {png}" in out
    assert tracr("results", "pareto", str(run), "--all") == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "8/30" in ln)
    assert "front" not in line and "drawn before" in out


def test_cli_draws_a_rate_sweep_front_per_rate(tmp_path, capsys):
    """A rate sweep (network.bandwidths) is a group of runs, one per rate: its fronts come
    from every run, each labelled with its rate (before: "has no configs.csv")."""
    from app_api.runner.bandwidths import group_row, write_group

    group = tmp_path / "group"
    members = []
    for bw, sub, thr in (("4MB/s", "bw-4MBps", 20.0), ("16MB/s", "bw-16MBps", 60.0)):
        w = RunWriter("pipe", out_dir=group / sub)
        # the configurations as a run records them (no rate of their own)
        w.add_configs([row([8, 40], 30.0, thr, bw=""), row([8, 30], 35.0, thr - 5, bw="")])
        w.close()
        summary = {"experiment": "pipe", "run_id": w.run_id, "status": "ok"}
        w.write_json("summary.json", summary)
        members.append(group_row(bw, summary, w.dir, group))
    write_group(group, {"kind": "bandwidth-group", "experiment": "pipe", "rows": members,
                        "status": "ok"})
    assert tracr("results", "pareto", str(group), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(g["bandwidth"], [r["config"] for r in g["front"]]) for g in doc["groups"]] == [
        ("4MB/s", ["8/40"]), ("16MB/s", ["8/40"])]
    assert (group / "plots" / "pareto.png").read_bytes().startswith(PNG_MAGIC)


def test_show_does_not_print_an_overhead_for_a_pipelined_run(capsys):
    """wall / sum(e2e) is below 1 when inferences overlap (0.657 printed before)."""
    from app_api.cli.results import print_summary

    base = {"experiment": "pipe", "run_id": "r", "inferences": 96, "failed": 0,
            "status": "ok", "wall_s": 80.0, "sum_e2e_s": 122.0, "overhead": 0.656,
            "splits": [], "best_split": None}
    print_summary({**base, "pipeline": {"configs": [row([8], 10.0, 50.0)]}}, "r")
    assert "overhead: - (pipelined: inferences overlap)" in capsys.readouterr().out
    print_summary(base, "r")
    assert "overhead: 0.656" in capsys.readouterr().out


def test_cli_json_parses_and_finds_the_run_as_last(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRACR_RESULTS_DIR", str(tmp_path / "results"))
    w = RunWriter("pipe")
    w.add_configs([row([8], 10.0, 50.0, nbytes=10.0), row([9], 20.0, 40.0, nbytes=1.0),
                   row([3], math.nan, 40.0)])
    w.close()
    w.write_json("summary.json", {"experiment": "pipe"})
    assert tracr("results", "pareto", "last", "--json", "--all",
                 "--objectives", "latency,throughput,bytes") == 0
    data = json.loads(capsys.readouterr().out)
    assert [o["name"] for o in data["objectives"]] == ["latency", "throughput", "bytes"]
    assert data["objectives"][1] == {"name": "throughput", "column": "throughput_per_s",
                                     "better": "higher"}
    [g] = data["groups"]
    assert [r["config"] for r in g["front"]] == ["8", "9"]
    assert [(p["config"], p["on_front"]) for p in g["points"]] == [("8", True), ("9", True)]
    assert g["excluded"][0]["reason"] == "no value for latency_ms_p50"
    assert g["excluded"][0]["row"]["latency_ms_p50"] is None  # NaN is not JSON
    assert data["plot"] == str(w.dir / "plots" / "pareto.png")


def test_cli_redraws_the_plot_only_when_asked(tmp_path, capsys):
    run = written_run(tmp_path)
    png = run / "plots" / "pareto.png"
    png.parent.mkdir()
    png.write_bytes(b"stale")
    assert tracr("results", "pareto", str(run), "--json") == 0
    assert png.read_bytes() == b"stale"
    assert tracr("results", "pareto", str(run), "--json", "--plot",
                 "--objectives", "latency,throughput,bytes") == 0
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_cli_errors(tmp_path, capsys):
    w = RunWriter("sweep", out_dir=tmp_path / "split-sweep")
    w.close()
    w.write_json("summary.json", {"experiment": "sweep"})
    assert tracr("results", "pareto", str(w.dir)) == 2
    err = capsys.readouterr().err
    assert ("error: this run has no configurations: pareto needs a pipeline sweep "
            "(mode: throughput)") in err and "Traceback" not in err
    run = written_run(tmp_path)
    assert tracr("results", "pareto", str(run), "--objectives", "latency,energy") == 2
    assert "Unknown objective 'energy'" in capsys.readouterr().err


def test_a_run_with_configs_gets_its_pareto_plot_after_the_run(tmp_path):
    from app_api.runner.gather import draw_plots

    run = written_run(tmp_path)
    draw_plots({"splits": []}, run)
    assert (run / "plots" / "pareto.png").read_bytes().startswith(PNG_MAGIC)
