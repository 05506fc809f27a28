"""A real localhost run's report.html in headless Chromium, its export and its DataFrames."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
#: flags that keep Chromium off the network and away from the user's profile
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                  "--no-first-run", "--disable-background-networking", "--disable-sync",
                  "--disable-component-update", "--disable-default-apps",
                  "--disable-extensions", "--no-proxy-server"]


def chromium() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    from app_api.manifest import load_manifest
    from app_api.runner import run_experiment

    out = tmp_path_factory.mktemp("report") / "run"
    res = run_experiment(load_manifest("alexnet-sweep", [
        "partitioner.params.repeats=2", "dataset.params.limit=2", "run.warmup=1"]),
        out_dir=out, progress=False)
    assert res.ok, res.errors
    return res.run_dir


def browse(exe: str, page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}", *args,
                           page.resolve().as_uri()], capture_output=True, text=True,
                          timeout=120, check=True)


@pytest.mark.slow
def test_report_html_renders_offline_with_its_tables_and_figures(run_dir, tmp_path):
    exe = chromium()
    if exe is None:
        pytest.skip("no chromium (CI installs it: .ci/run)")
    page = run_dir / "report.html"
    pngs = sorted(p.name for p in (run_dir / "plots").glob("*.png"))
    assert {"latency_per_split.png", "bytes_per_split.png", "layers.png"} <= set(pngs)
    dom = browse(exe, page, tmp_path, "--dump-dom", "--virtual-time-budget=5000").stdout
    for section in ("splits", "budget", "partitioners", "figures", "link", "environment",
                    "metrics", "manifest"):
        assert f'id="{section}"' in dom, section
    imgs = re.findall(r'<img alt="([^"]+)"[^>]*src="data:image/png;base64,', dom)
    assert sorted(f"{a}.png" for a in imgs) == pngs
    summary_rows = re.search(r'id="splits".*?<tbody>(.*?)</tbody>', dom, re.S).group(1)
    splits = json.loads((run_dir / "summary.json").read_text())["splits"]
    assert summary_rows.count("<tr") == len(splits)
    shot = tmp_path / "shot.png"
    browse(exe, page, tmp_path, f"--screenshot={shot}", "--window-size=1200,4000",
           "--virtual-time-budget=5000")
    from PIL import Image

    with Image.open(shot) as im:
        assert im.size == (1200, 4000)
        colours = {c for _, c in im.convert("RGB").getcolors(maxcolors=1 << 20)}
    # the table header's grey, and the figures' edge blue and cloud green, are on screen
    for hex_ in ("f3f3f3", "4c72b0", "55a868"):
        rgb = tuple(int(hex_[i:i + 2], 16) for i in (0, 2, 4))
        assert any(all(abs(a - b) <= 3 for a, b in zip(c, rgb, strict=True)) for c in colours), hex_


def test_export_parquet_round_trips_and_load_gives_dataframes(run_dir, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    from app_api.results import load

    out = tmp_path / "export"
    env = {**os.environ, "TRACR_RESULTS_DIR": str(run_dir.parent)}
    subprocess.run([sys.executable, "-m", "app", "results", "export", str(run_dir),
                    "--format", "parquet", "--out", str(out)], check=True, timeout=120,
                   env=env, capture_output=True, cwd=Path(__file__).resolve().parents[2])
    run = load(run_dir)
    assert isinstance(run.inferences, pd.DataFrame) and len(run.inferences) > 0
    pd.testing.assert_frame_equal(pd.read_parquet(out / "inferences.parquet"), run.inferences)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "splits.parquet"), run.splits)
    assert len(pd.read_parquet(out / "stages.parquet")) == 2 * len(run.inferences)
