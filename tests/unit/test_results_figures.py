"""A run's figures, report.html and DataFrames, from run directories written by RunWriter."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from app_api.results import RunWriter, build_summary
from app_api.results.budget import run_budget
from app_api.results.figures import draw_kinds
from app_api.results.report import write_report
from app_api.results.split_plots import best_mark

LAYERS = ["input", "conv", "relu", "pool", "fc"]


def write_run(tmp_path: Path, hops: int = 2, slow_first: float = 0.0,
              metrics: bool = False) -> tuple[Path, dict]:
    """A run directory as the runner leaves it: 3 inferences at each of 5 splits over a
    chain of ``hops`` stages, their layers and stage records, environment and summary."""
    rng = random.Random(0)
    w = RunWriter("figs", out_dir=tmp_path / "run")
    rows, layers, stages = [], [], []
    iid = 0
    for k in range(5):
        for _ in range(3):
            edge, cloud = 2.0 * k + rng.random(), 10.0 - 2 * k + rng.random()
            wire = 5.0 / (k + 1)
            e2e = edge + 0.2 + wire + 0.1 + cloud + (slow_first if k == 0 else 0.0)
            rows.append({"inference": iid, "item": f"img{iid}", "split": k, "layer": LAYERS[k],
                         "edge_ms": edge, "encode_ms": 0.2, "decode_ms": 0.1, "cloud_ms": cloud,
                         "transfer_ms": e2e - edge - cloud - 0.3, "e2e_ms": e2e,
                         "bytes_raw": 4000 * (5 - k), "bytes_encoded": 3000 * (5 - k),
                         "transport": "", "instance": "edge-1", "t_unix": 1e9 + iid})
            for i in range(1, 5):
                layers.append({"inference": iid, "instance": "edge-1" if i <= k else "cloud-1",
                               "side": "edge" if i <= k else "cloud", "index": i,
                               "name": LAYERS[i], "type": "Conv2d", "ms": 0.5 * i})
            t = 1000.0 * iid
            names = ["edge-1", *(f"stage-{h}" for h in range(1, hops - 1)), "cloud-1"]
            for h, name in enumerate(names):
                rec = {"inference": iid, "config": str(k) if hops == 2 else f"{k}/4",
                       "mode": "latency", "hop": h, "instance": name, "first": 1, "last": 4,
                       "queue": 0, "compute_ms": 1.0, "cpu_ms": 1.0}
                if h == 0:
                    rec.update(t_start_ms=t, t_end_ms=t + edge, encode_ms=0.2, send_ms=0.1,
                               t_sent_ms=t + edge + 0.3)
                else:
                    span = cloud / (hops - 1)
                    rec.update(t_arrive_ms=t + 100 * h, decode_ms=0.1 / (hops - 1),
                               t_start_ms=t + 100 * h, t_end_ms=t + 100 * h + span,
                               **({"encode_ms": 0.0, "send_ms": 0.0,
                                   "t_sent_ms": t + 100 * h + span} if h < hops - 1 else {}))
                stages.append(rec)
            iid += 1
    w.add_inferences(rows)
    w.add_layers(layers)
    w.add_stages(stages)
    w.close()
    envs = {"edge-1": {"role": "edge", "hostname": "vm", "cpu_model": "Test CPU", "threads": 1,
                       "device": "cpu", "python": "3.11"},
            "cloud-1": {"role": "cloud", "hostname": "vm", "cpu_model": "Test CPU", "threads": 1,
                        "device": "cpu", "python": "3.11"}}
    w.write_json("environment.json", envs)
    w.write_text("manifest.yaml", "model: {name: alexnet}\n")
    summary = build_summary(w.rows, experiment="figs", run_id=w.run_id, status="ok",
                            model="alexnet", weights="random", wall_s=1.0,
                            network={"edge-1": {"bandwidth_Bps": 5e6, "rtt_ms": 0.2}})
    summary["latency_budget"] = run_budget(w.dir, w.rows)
    if metrics:
        summary["metrics"] = {"edge-1": {
            "memory": {"per_split_peak_rss_kb": {str(k): 200_000 + 1000 * k for k in range(5)},
                       "per_split_method": "sampled VmRSS"},
            "energy_per_split": {"rapl": {str(k): {"j_per_inference": 0.5 + 0.1 * k,
                                                   "interval": [0.4, 0.7 + 0.1 * k],
                                                   "label": "estimated", "method": "model"}
                                          for k in range(5)}}}}
    w.write_json("summary.json", summary)
    return w.dir, summary


def dpi_of(path: Path) -> float:
    from PIL import Image

    with Image.open(path) as im:
        return round(im.info["dpi"][0])


@pytest.mark.slow
def test_a_two_party_run_gets_every_figure_that_applies_at_300_dpi(tmp_path):
    run_dir, summary = write_run(tmp_path, metrics=True)
    paths = draw_kinds(summary, run_dir)
    names = sorted(p.name for p in paths)
    assert names == ["best_vs_bandwidth.png", "bytes_per_split.png", "latency_per_split.png",
                     "layers.png", "resources.png"]
    assert all(dpi_of(p) == 300 for p in paths)
    more = draw_kinds(summary, run_dir, ["latency"], ["svg", "pdf"])
    assert sorted(p.name for p in more) == ["latency_per_split.pdf", "latency_per_split.svg"]
    svg = (run_dir / "plots" / "latency_per_split.svg").read_text()
    for text in ("latency (ms)", "split point", "bootstrap 95% interval", "Test CPU"):
        assert text in svg, text


def test_the_best_is_marked_only_when_it_is_separated():
    splits = [{"split": k} for k in range(4)]
    assert best_mark({"best_split": 2, "best_set": {"splits": [2]}}, splits) == ("best", [2])
    assert best_mark({"best_split": 2, "best_set": {"splits": [1, 2]}}, splits) == (
        "tie", [1, 2])
    assert best_mark({"best_split": 2, "best_set": {"splits": [0, 1, 2, 3]}}, splits) == (
        "all tied", [])


def test_a_three_stage_chain_is_drawn_by_stage_not_as_edge_transfer_cloud(tmp_path):
    run_dir, summary = write_run(tmp_path, hops=3)
    names = sorted(p.name for p in draw_kinds(summary, run_dir))
    assert names == ["latency_per_config.png"]


def test_report_html_holds_the_tables_and_every_figure_and_fetches_nothing(tmp_path):
    run_dir, summary = write_run(tmp_path, slow_first=30.0, metrics=True)
    figures = draw_kinds(summary, run_dir)
    page = write_report(run_dir).read_text()
    assert page.count("<img ") == len(figures) == 5
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
    for text in ("Per split point", "p99 ms", "Latency budget", "Worst residual",
                 "Environment of each participant", "Test CPU", "Manifest", "model: {name",
                 "Measured link", "Metrics and their methods", "sampled VmRSS"):
        assert text in page, text
    assert "<tr class=\"best\">" in page


def test_a_run_loads_as_dataframes_and_exports_round_trip(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    from app_api.results import load

    run_dir, summary = write_run(tmp_path)
    run = load(run_dir)
    assert isinstance(run.inferences, pd.DataFrame) and len(run.inferences) == 15
    assert run.inferences["e2e_ms"].dtype.kind == "f"
    assert list(run.splits["split"]) == [0, 1, 2, 3, 4]
    assert {"e2e_ms_p90", "e2e_ms_p99", "e2e_ms_ci95_lo", "in_best_set"} <= set(run.splits)
    assert len(run.stages) == 30 and len(run.layers) == 60 and run.configs.empty
    for fmt, read in (("parquet", pd.read_parquet), ("csv", pd.read_csv),
                      ("json", lambda p: pd.read_json(p, orient="records"))):
        paths = run.export(fmt, tmp_path / fmt)
        assert sorted(p.name for p in paths) == sorted(
            [f"{t}.{fmt}" for t in ("inferences", "layers", "splits", "stages")]
            + ["summary.json"])
        back = read(tmp_path / fmt / f"inferences.{fmt}")
        assert list(back["e2e_ms"]) == pytest.approx(list(run.inferences["e2e_ms"]))
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "parquet" / "inferences.parquet"),
                                  run.inferences)
    assert json.loads((tmp_path / "json" / "summary.json").read_text())["run_id"] == \
        summary["run_id"]


def test_an_unknown_export_format_is_refused_with_the_valid_ones(tmp_path):
    from app_api.results import load
    from experiment_design.errors import TracrError

    run_dir, _ = write_run(tmp_path)
    with pytest.raises(TracrError) as err:
        load(run_dir).export("xlsx")
    assert "csv, parquet, json" in err.value.hint


def test_tracr_results_plot_draws_the_kinds_and_formats_asked_and_rewrites_the_report(
        tmp_path, capsys):
    from app import main

    run_dir, _ = write_run(tmp_path)
    assert main(["results", "plot", str(run_dir), "--kind", "latency", "--kind", "bytes",
                 "--format", "svg", "--format", "png"]) == 0
    assert sorted(p.name for p in (run_dir / "plots").iterdir()) == [
        "bytes_per_split.png", "bytes_per_split.svg", "latency_per_split.png",
        "latency_per_split.svg"]
    assert (run_dir / "report.html").exists()
    assert main(["results", "plot", str(run_dir), "--kind", "pareto"]) == 0
    assert "no figure applies" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:  # argparse names the valid formats
        main(["results", "export", str(run_dir), "--format", "xlsx"])
    assert exit_.value.code == 2
