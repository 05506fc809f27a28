"""`tracr results compare`: runs of one experiment side by side, with how far the best
split moved, how far the whole run moved and each device's start-up reference."""

from __future__ import annotations

import json

import pytest

import app
from app_api.results import RunWriter, build_summary
from app_api.results.compare import compare_runs
from app_api.runner.bandwidths import group_row, write_group
from experiment_design.errors import TracrError

# split -> median e2e ms of a first run; split 2 is the best
BASE = {0: 50.0, 1: 40.0, 2: 30.0, 3: 31.0, 4: 60.0}


def _rows(medians: dict[int, float], n: int = 9) -> list[dict]:
    rows = []
    for k in range(n):
        for split, ms in medians.items():
            # a small symmetric spread around the median (k = 4 is the middle sample)
            e2e = ms * (1 + (k - 4) * 0.001)
            rows.append({"inference": len(rows), "item": "a.jpg", "split": split,
                         "layer": f"l{split}", "e2e_ms": e2e, "edge_ms": e2e * 0.5,
                         "transfer_ms": e2e * 0.3, "cloud_ms": e2e * 0.2, "error": ""})
    return rows


def _run(where, medians: dict[int, float], model: str = "alexnet",
         refs: tuple[float, float] | None = (100.0, 20.0)):
    w = RunWriter("exp", out_dir=where)
    rows = _rows(medians)
    w.add_inferences(rows)
    w.close()
    summary = build_summary(w.rows, experiment="exp", run_id=w.run_id, model=model,
                            status="ok")
    w.write_json("summary.json", summary)
    if refs is not None:
        w.write_json("partitioners.json", {"inputs": {
            "edge_profile": {"full_ms": refs[0]}, "cloud_profile": {"full_ms": refs[1]}}})
    return w.dir, summary


def _group(where, per_rate: dict[str, dict[int, float]], refs=(100.0, 20.0)):
    members = []
    for bw, medians in per_rate.items():
        run_dir, summary = _run(where / f"bw-{bw.replace('/', 'p')}", medians, refs=refs)
        members.append(group_row(bw, summary, run_dir, where))
    write_group(where, {"kind": "bandwidth-group", "experiment": "exp", "model": "alexnet",
                        "rows": members, "status": "ok"})
    return where


def test_a_machine_that_slowed_down_moves_every_split_not_the_best_alone(tmp_path):
    """Run b is run a with every split 10% slower (the machine): the best moved 10%, the
    whole run moved 10%, and nothing is left beyond that shift."""
    a, _ = _run(tmp_path / "a", BASE)
    b, _ = _run(tmp_path / "b", {s: m * 1.10 for s, m in BASE.items()}, refs=(110.0, 22.0))
    doc = compare_runs([a, b])
    (row,) = doc["rows"]
    assert row["bandwidth"] == "-" and row["same_best"] and row["bests_tie"]
    assert [r["best"] for r in row["runs"]] == [2, 2]
    assert row["best_moved"] == pytest.approx(0.10, abs=1e-9)
    assert row["shift"] == pytest.approx([1.0, 1.10])
    assert row["best_moved_beyond_shift"] == pytest.approx(0.0, abs=1e-9)
    assert row["reference_moved"] == pytest.approx({"edge": 0.10, "cloud": 0.10})
    assert row["common_splits"] == 5
    # the first run's best, split into what each device and the link took, per run
    assert row["parts"]["split"] == 2
    assert row["parts"]["edge"] == pytest.approx([15.0, 16.5])
    assert row["parts"]["transfer"] == pytest.approx([9.0, 9.9])


def test_the_best_split_alone_moving_is_reported_beyond_the_shift(tmp_path):
    """Run b is run a with only split 2 slower by 2.5%: still the best, every other split
    unchanged, so the whole run did not move and the 2.5% is the split's own."""
    a, _ = _run(tmp_path / "a", BASE)
    b, _ = _run(tmp_path / "b", {**BASE, 2: 30.75})
    (row,) = compare_runs([a, b])["rows"]
    assert row["same_best"]
    assert row["best_moved"] == pytest.approx(0.025)
    assert row["shift"] == pytest.approx([1.0, 1.0])
    assert row["best_moved_beyond_shift"] == pytest.approx(0.025)


def test_a_different_best_is_a_tie_only_when_each_is_in_the_others_best_set(tmp_path):
    """Splits 2 and 3 a hair apart with a wide spread: run b's best is 3, and each run's
    best set holds both, so the runs agree up to noise ('tie'); far apart, they do not."""
    a, _ = _run(tmp_path / "a", BASE)
    b, _ = _run(tmp_path / "b", {**BASE, 2: 31.5})
    (row,) = compare_runs([a, b])["rows"]
    assert [r["best"] for r in row["runs"]] == [2, 3]
    assert not row["same_best"] and not row["bests_tie"]  # 2 vs 31 ms, spread 0.4%: separated

    def wide(medians, n=9):
        rows = []
        for k in range(n):
            for split, ms in medians.items():
                rows.append({"inference": len(rows), "item": "a.jpg", "split": split,
                             "layer": f"l{split}", "e2e_ms": ms * (1 + (k - 4) * 0.05),
                             "error": ""})
        return rows

    dirs = []
    for name, med in (("c", BASE), ("d", {**BASE, 2: 31.5})):
        w = RunWriter("exp", out_dir=tmp_path / name)
        w.add_inferences(wide(med))
        w.close()
        w.write_json("summary.json", build_summary(w.rows, experiment="exp", model="alexnet"))
        dirs.append(w.dir)
    (row,) = compare_runs(dirs)["rows"]
    assert [r["best"] for r in row["runs"]] == [2, 3] and row["bests_tie"]
    assert row["reference_moved"] == {"edge": None, "cloud": None}  # no partitioners.json


def test_groups_are_compared_rate_by_rate_on_the_rates_they_share(tmp_path):
    a = _group(tmp_path / "a", {"1MB/s": BASE, "4MB/s": {s: m / 2 for s, m in BASE.items()}})
    b = _group(tmp_path / "b", {"1MB/s": {s: m * 1.05 for s, m in BASE.items()},
                                "16MB/s": BASE})
    doc = compare_runs([a, b])
    assert [r["bandwidth"] for r in doc["rows"]] == ["1MB/s"]
    assert doc["left_out"] == ["16MB/s", "4MB/s"]
    assert doc["rows"][0]["best_moved"] == pytest.approx(0.05)


def test_runs_of_different_models_or_a_lone_run_are_refused(tmp_path):
    a, _ = _run(tmp_path / "a", BASE)
    b, _ = _run(tmp_path / "b", BASE, model="resnet18")
    with pytest.raises(TracrError, match="different models"):
        compare_runs([a, b])
    with pytest.raises(TracrError, match="two runs"):
        compare_runs([a])
    (tmp_path / "empty").mkdir()
    with pytest.raises(TracrError, match="no finished run"):
        compare_runs([a, tmp_path / "empty"])


def test_cli_prints_the_table_and_the_json(tmp_path, capsys):
    a, _ = _run(tmp_path / "a", BASE)
    b, _ = _run(tmp_path / "b", {s: m * 1.10 for s, m in BASE.items()}, refs=(110.0, 22.0))
    assert app.main(["results", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "2: 30.0  2: 33.0" in out and "10.0%" in out and "+10.0%" in out
    assert app.main(["results", "compare", str(a), str(b), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == "alexnet" and len(doc["rows"]) == 1
