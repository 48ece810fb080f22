"""The HTML scorecard in a real browser: it loads cleanly and its plots (the microscope's
heatmap too) are drawn.

Needs /usr/bin/chromium. Where it is missing the test is skipped, except in CI (the
``CI`` environment variable set), where a skipped browser check would hide a broken page.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from harness.running.results import ScenarioResult, SuiteResult
from harness.scorecard.render import write_scorecards
from harness.scorecard.render.plots import FAULTED
from tests.microscope_support import HOT_LAYER, write_journal, write_microscope
from tests.scorecard_support import make_suite

CHROMIUM = Path("/usr/bin/chromium")
TIMEOUT_S = 60
WIDTH, HEIGHT = 1200, 3000


def _chromium(page: Path, profile: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium once on ``page``; the whole process group dies at the deadline."""
    args = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *mode,
        f"--window-size={WIDTH},{HEIGHT}",
        page.as_uri(),
    ]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this Popen started, nothing else
        proc.communicate()
        pytest.fail(f"chromium did not finish rendering {page} within {TIMEOUT_S} s")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scorecard.html of the three-scenario suite, or a skip (a failure in CI) without chromium."""
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is not installed; the HTML scorecard is not checked in a browser"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set, so this check must run)")
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("card")
    return write_scorecards(make_suite(out), out)["html"]


def _console_errors(stderr: str) -> list[str]:
    # Chromium logs every console message as INFO:CONSOLE whatever its level; the page
    # has no scripts, so any console message at all means something went wrong.
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def test_page_loads_without_console_errors_and_keeps_its_plots(page: Path, tmp_path: Path) -> None:
    done = _chromium(page, tmp_path / "profile", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console_errors(done.stderr) == []
    dom = done.stdout
    assert 'id="plot-nan-grad-loss"' in dom and 'id="plot-crash-resume-grad-norm"' in dom
    loss_plot = dom.split('id="plot-nan-grad-loss"', 1)[1].split("</figure>", 1)[0]
    assert "<svg" in loss_plot and loss_plot.count("<path") > 10


def test_screenshot_shows_the_plots_drawn(page: Path, tmp_path: Path) -> None:
    from PIL import Image

    shot = tmp_path / "scorecard.png"
    done = _chromium(page, tmp_path / "profile", f"--screenshot={shot}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console_errors(done.stderr) == []
    assert shot.exists() and shot.stat().st_size > 0

    image = Image.open(shot).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    rgb = np.asarray(image, dtype=np.int32)
    # Not a blank page: text, tables and plots give it many colours.
    assert len(image.getcolors(maxcolors=1 << 24) or []) > 200

    # Find the first plot by the faulted run's line colour: the first band of rows,
    # top down, that holds it is the first scenario's loss plot.
    target = np.array([int(FAULTED[i : i + 2], 16) for i in (1, 3, 5)])
    rows = np.nonzero((np.abs(rgb - target).sum(axis=2) <= 40).sum(axis=1) >= 3)[0]
    assert rows.size, "no pixel of the faulted run's colour anywhere: the plots were not drawn"
    top = bottom = int(rows[0])
    for y in rows[1:]:
        if y - bottom > 40:  # a gap this tall is the space below the first plot
            break
        bottom = int(y)
    assert bottom - top > 100, f"the first plot's line spans only rows {top}..{bottom}"

    region = rgb[top : bottom + 1]
    colours, counts = np.unique(region.reshape(-1, 3), axis=0, return_counts=True)
    drawn = region.shape[0] * region.shape[1] - counts.max()
    assert drawn > 2000, f"only {drawn} drawn pixels where the loss plot should be"
    assert len(colours) > 20, f"only {len(colours)} colours where the loss plot should be"
    # The translucent red band of the injected fault is drawn on it too.
    fault_band = np.abs(colours - np.array([0xF2, 0xAE, 0xAE])).sum(axis=1) <= 60
    assert fault_band.any(), "no fault marker in the loss plot"
    # No run of this suite has microscope records: no heatmap's hottest colour anywhere
    # (the negative control of the microscope's screenshot check below).
    assert (_viridis_top_rows(rgb)).size == 0


@pytest.fixture(scope="module")
def microscope_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scorecard.html of one two-rank scenario with microscope records (a blow-up in one
    layer, the trainer's diagnosis naming it), or a skip (a failure in CI) without chromium."""
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is not installed; the HTML scorecard is not checked in a browser"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set, so this check must run)")
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("micro-card")
    write_microscope(out / "runs" / "blowup", ranks=2)
    write_journal(out / "runs" / "blowup", diagnosed=[HOT_LAYER])
    scenario = ScenarioResult(
        name="blowup", fault_class="numeric", weight=1.0, checks=[], run_dir="runs/blowup"
    )
    suite = SuiteResult(suite="micro", preset="tiny", scenarios=[scenario], seconds=1.0)
    return write_scorecards(suite, out)["html"]


def _viridis_top(rgb: np.ndarray) -> np.ndarray:
    """Pixels of the heatmap colour map's top colour (the hottest cell's)."""
    from matplotlib import colormaps

    top = (np.array(colormaps["viridis"](1.0)[:3]) * 255).astype(np.int32)
    return np.asarray(np.abs(rgb - top).sum(axis=2) <= 30)


def _viridis_top_rows(rgb: np.ndarray) -> np.ndarray:
    """Rows holding a run of that colour as wide as a cell (the colour bar's is narrower)."""
    return np.nonzero(_viridis_top(rgb).sum(axis=1) >= 15)[0]


@pytest.mark.slow
def test_microscope_views_load_cleanly_and_the_heatmap_is_drawn(
    microscope_page: Path, tmp_path: Path
) -> None:
    from matplotlib import colormaps
    from PIL import Image

    done = _chromium(microscope_page, tmp_path / "dom", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console_errors(done.stderr) == []
    for view in ("grad", "update", "act", "latency", "allreduce"):
        assert f'id="micro-blowup-{view}"' in done.stdout, view
    page = microscope_page.read_text()
    for outside in ("<script", "<link", "src=", "url(http", "@import"):
        assert outside not in page  # self-contained: the heatmaps' PNGs are inline data

    shot = tmp_path / "micro.png"
    done = _chromium(microscope_page, tmp_path / "shot", f"--screenshot={shot}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console_errors(done.stderr) == []
    rgb = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int32)

    # The hot cell: a solid block of the colour map's top colour, in the first heatmap (rows
    # that hold a run of it; the colour bar's top is a narrower strip).
    rows = _viridis_top_rows(rgb)
    hot = _viridis_top(rgb)
    assert rows.size, "no block of the heatmap's hottest colour: the heatmap was not drawn"
    hot_y = rows[rows < rows[0] + 60]  # the gradient heatmap is above the update-ratio one
    hot_x = np.nonzero(hot[hot_y].any(axis=0))[0]
    assert np.ptp(hot_y) > 8, f"the hot cell spans only rows {hot_y.min()}..{hot_y.max()}"
    assert 15 <= np.ptp(hot_x) < 200, f"the hot cell spans columns {hot_x.min()}..{hot_x.max()}"
    # Around it, the cold cells: the colour map's bottom colour fills most of the rows.
    cold = (np.array(colormaps["viridis"](0.0)[:3]) * 255).astype(np.int32)
    band = rgb[hot_y.min() - 60 : hot_y.max() + 60]
    cold_pixels = (np.abs(band - cold).sum(axis=2) <= 60).sum()
    assert cold_pixels > 20_000, f"only {cold_pixels} pixels of cold cells around the hot one"
    # The diagnosed row's outline runs the width of the heatmap through the hot cell's row.
    outline = (np.abs(band - np.array([0xFF, 0x7F, 0x0E])).sum(axis=2) <= 60).sum(axis=1)
    assert outline.max() > 400, "no outline of the diagnosed row"
