"""scripts/plot.py on synthetic TensorBoard logs with known values: the table's
means, bootstrap bounds, seed counts and steps; pooling of runs; a resumed
stream; wall-clock times; the figure files; bad input."""
import os
import sys
import time

import numpy as np
import pytest
from tensorboardX import SummaryWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import plot  # noqa: E402

TAG = "eval/episode_return"
STEPS = (1000, 2000, 3000)


def write_run(root, name, seeds, env, suffix=""):
    """A run directory like RunLogger's: config.json and seed_<n>/ event files.
    seeds: {n: [value at each of STEPS]}; value k is logged 5 s * (k + 1)
    after the writer starts. Returns the run and the writers' start times."""
    run = root / name
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.json").write_text(f'{{"env": "{env}"}}')
    starts = {}
    for seed, values in seeds.items():
        t0 = time.time()
        w = SummaryWriter(str(run / f"seed_{seed}"), filename_suffix=suffix)
        for k, (step, v) in enumerate(zip(STEPS, values)):
            w.add_scalar(TAG, v, step, walltime=t0 + 5.0 * (k + 1))
            w.add_scalar("charts/sps", 123.0, step, walltime=t0 + 5.0 * (k + 1))
        w.close()
        starts[seed] = t0
    return run, starts


def rows_of(text):
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] not in ("task", "---"):
            out[(cells[0], cells[1])] = cells[2:]
    return out


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    # td3 on cheetah_run in two runs, pooled: finals 100, 200 and 150
    a, starts = write_run(root, "cheetah_run__td3__1__100", {1: [10, 20, 999], 2: [30, 40, 200]},
                          "cheetah_run")
    time.sleep(0.01)
    # a resumed seed 1: a later event file logs step 3000 again; the later value wins
    w = SummaryWriter(str(a / "seed_1"), filename_suffix=".resumed")
    w.add_scalar(TAG, 100.0, 3000, walltime=starts[1] + 15.0)
    w.close()
    write_run(root, "cheetah_run__td3__7__200", {7: [20, 30, 150]}, "cheetah_run")
    # sac: three equal seeds -> a zero-width interval
    write_run(root, "cheetah_run__sac__1__100", {1: [5, 6, 300], 2: [5, 6, 300], 3: [5, 6, 300]},
              "cheetah_run")
    # one seed: no interval
    write_run(root, "walker_walk__td3__1__100", {1: [1, 2, 50]}, "walker_walk")
    return root


def test_table_numbers_and_figures(logs, tmp_path, capsys):
    out = tmp_path / "plots" / "returns"
    text = plot.main([str(logs), "--out", str(out), "--format", "png", "pdf"])
    rows = rows_of(text)
    assert set(rows) == {("cheetah_run", "td3"), ("cheetah_run", "sac"), ("walker_walk", "td3")}
    # mean, CI, seeds, steps. n=3 seeds: each extreme has bootstrap probability
    # (1/3)^3 = 3.7% > 2.5%, so the percentile interval is exactly [min, max].
    assert rows[("cheetah_run", "td3")] == ["150.0", "[100.0, 200.0]", "3", "3000"]
    assert rows[("cheetah_run", "sac")] == ["300.0", "[300.0, 300.0]", "3", "3000"]
    assert rows[("walker_walk", "td3")] == ["50.0", "n/a (1 seed)", "1", "3000"]
    assert (tmp_path / "plots" / "returns.md").read_text() == text
    assert "wrote" in capsys.readouterr().out
    png = (tmp_path / "plots" / "returns.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "plots" / "returns.pdf").read_bytes()[:5] == b"%PDF-"
    from PIL import Image
    width, height = Image.open(out.with_suffix(".png")).size
    assert width > height  # two task columns side by side


def test_curves_and_wall_clock(logs):
    groups = plot.load([str(logs)], TAG)
    td3 = groups[plot.Group("cheetah_run", "td3")]
    assert len(td3) == 3
    c = plot.curve(td3)
    np.testing.assert_array_equal(c.steps, STEPS)
    np.testing.assert_allclose(c.mean, [np.mean([10, 30, 20]), np.mean([20, 40, 30]), 150.0])
    assert (c.lo <= c.mean).all() and (c.mean <= c.hi).all()
    # wall-clock: event time minus the stream's first event (the writer's start), per seed
    for series in td3:
        np.testing.assert_allclose(series.times, [5.0, 10.0, 15.0], atol=0.5)
    sac = plot.curve(groups[plot.Group("cheetah_run", "sac")])
    np.testing.assert_array_equal(sac.lo, sac.hi)
    one = plot.curve(groups[plot.Group("walker_walk", "td3")])
    assert np.isnan(one.lo).all()


def test_bootstrap_two_values_spans_them():
    lo, hi = plot.bootstrap_ci([3.0, 7.0])
    assert (lo, hi) == (3.0, 7.0)
    lo, hi = plot.bootstrap_ci(np.arange(100.0))
    assert 40 < lo < 49.5 < hi < 59


def test_by_run_other_tag_and_single_run(logs, tmp_path):
    text = plot.main([str(logs / "cheetah_run__td3__1__100"),
                      str(logs / "cheetah_run__td3__7__200"),
                      "--by-run", "--tag", "charts/sps", "--out", str(tmp_path / "sps")])
    rows = rows_of(text)
    assert rows[("cheetah_run", "cheetah_run__td3__1__100")] == ["123.0", "[123.0, 123.0]", "2",
                                                                 "3000"]
    assert rows[("cheetah_run", "cheetah_run__td3__7__200")][2] == "1"


@pytest.mark.parametrize("args,message", [
    (["/nonexistent/run"], "no run directory"),
    (["TAGS", "--tag", "losses/none"], "tags found: charts/sps, eval/episode_return"),
    (["TAGS", "--format", "gif"], "invalid choice"),
])
def test_bad_input_one_line_exit_2(args, message, logs, capsys):
    args = [str(logs) if a == "TAGS" else a for a in args]
    with pytest.raises(SystemExit) as e:
        plot.main(args + ["--out", str(logs / "unused")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_torn_tail_is_ignored(logs, tmp_path):
    """A run still writing may end mid-record: the complete records count."""
    import shutil
    run = tmp_path / "cheetah_run__td3__1__100"
    shutil.copytree(logs / "walker_walk__td3__1__100", run)
    (event,) = (run / "seed_1").iterdir()
    event.write_bytes(event.read_bytes() + b"\x10\x00\x00\x00\x00\x00\x00\x00\x01")
    groups = plot.load([str(run)], TAG)
    (series,) = groups[plot.Group("walker_walk", "td3")]
    assert series.values.tolist() == [1.0, 2.0, 50.0]
