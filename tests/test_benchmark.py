"""scripts/benchmark.py runs end to end (smoke check only: timed assertions do
not belong in tests)."""
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "benchmark.py")


def _run(*args, timeout=240):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"))


def _check_envs_quick_table(stdout: str) -> None:
    """`envs --quick`'s output (full --quick's first part): one measured row."""
    lines = stdout.splitlines()
    head = [i for i, ln in enumerate(lines) if "raw rollout" in ln and "native/raw" in ln]
    assert head, stdout
    rows = [ln for ln in lines[head[-1] + 2:] if ln.startswith("cartpole_balance")]
    assert len(rows) == 1, stdout
    fields = rows[0].split()
    assert fields[1] == "16"
    raw, native, ratio, cpu_ratio = (float(x) for x in fields[2:6])
    assert raw > 0 and native > 0 and ratio > 0 and cpu_ratio > 0
    assert abs(ratio - native / raw) < 0.5  # the ratio column is about native/raw
    assert re.search(r"mjx: skipped", stdout)


def test_bad_task_is_one_line_and_exit_2():
    r = _run("envs", "--tasks", "cheetah_fly", "--skip-mjx")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "cheetah_fly" in err[0] and "cheetah_run" in err[0]


def test_mode_is_required():
    r = _run()
    assert r.returncode == 2
    assert "envs" in r.stderr


def test_full_quick_runs_every_part_and_writes_a_report(tmp_path):
    """`full --quick`: every part end to end (tiny; `envs --quick` is its first),
    the report with all tables, and a rerun that resumes (nothing left to do)."""
    out = str(tmp_path / "bench")
    r = _run("full", "--quick", "--out", out, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "about" in r.stdout.splitlines()[0] and "minutes" in r.stdout.splitlines()[0]
    _check_envs_quick_table(open(os.path.join(out, "envs.txt")).read())
    train = open(os.path.join(out, "train.txt")).read()
    rows = [ln for ln in train.splitlines() if ln.startswith("cartpole_balance")]
    ref = [ln for ln in rows if "reference TD3" in ln]
    assert ref and "1.00x" in ref[0], train
    td3 = [ln for ln in rows if " td3 " in ln and "1 env" in ln]
    ratio = [f for f in td3[0].split() if f.endswith("x")]
    assert ratio and float(ratio[0][:-1]) > 0, td3
    assert any(" ppo " in ln for ln in rows), train
    # the loop-efficiency table: td3's acting, update floor and loop, all measured
    eff = [ln.split() for ln in train.split("loop efficiency")[1].splitlines()
           if ln.startswith("cartpole_balance") and " td3 " in ln]
    assert len(eff) == 1, train
    acting, update, floor, loop, efficiency = eff[0][-6:-1]
    assert min(float(acting), float(update), float(loop)) > 0 and float(floor) == float(update)
    assert 0 < float(efficiency.rstrip("%")) < 200, eff
    report = open(os.path.join(out, "results.md")).read()
    for title in ("Environment throughput", "Training throughput", "Seeds in one program",
                  "Learning"):
        assert title in report, report
    learn = [ln for ln in report.splitlines() if ln.startswith("| td3 |")]
    assert learn and "steps" in learn[0], report
    again = _run("full", "--quick", "--out", out, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "no part(s) left" in again.stdout and "0 run(s) left" in again.stdout, again.stdout


def test_wall_table_picks_the_last_evaluation_within_the_budget(tmp_path):
    """The fixed wall-clock table from synthetic logs: evaluations at 5, 10 and
    15 s after each stream began (tests/test_plot.py's writer)."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from benchmarks import learn
    from test_plot import write_run
    write_run(tmp_path / "runs", "cheetah_run__td3__1__100", {1: [10, 20, 30], 2: [30, 40, 60]},
              "cheetah_run")
    rows = [dict(algo="td3", task="cheetah_run", run_dir="runs/cheetah_run__td3__1__100")]

    def cell(seconds):
        line = [ln for ln in learn.wall_table(rows, str(tmp_path), seconds).splitlines()
                if ln.startswith("| td3 |")][0]
        return line.split("|")[2].strip()

    assert cell(12) == "30 (2k steps)"     # mean of 20 and 40, logged at 10 s
    assert cell(100) == "45 (3k steps)"    # the final evaluation
    assert cell(3) == "no eval yet"


def test_non_positive_jobs_is_one_line_and_status_2(tmp_path):
    r = _run("learn", "--quick", "--jobs", "0", "--out", str(tmp_path / "b"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "--jobs must be positive" in r.stderr
    assert not os.path.exists(tmp_path / "b")


def test_profile_loop_varies_every_off_policy_agent_and_refuses_others():
    """`benchmark.py profile` edits each agent's iteration in memory: every
    off-policy file must still hold the two lines it varies, and PPO (no
    replay loop) or a typo gets one line and exit status 2."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from benchmarks import profile_loop
    for algo in profile_loop.OFF_POLICY:
        src = open(os.path.join(ROOT, "algos", f"{algo}.py")).read()
        changed = {name for name, code in profile_loop.variants(src).items() if code != src}
        assert changed == {"no cond", "no metrics", "no cond, no metrics"}, algo
    for args, message in [(["ppo", "cheetah_run"], "off-policy agents"),
                          (["td5", "cheetah_run"], "off-policy agents"),
                          (["sac", "cheetah_run", "--iters", "0"], "must be positive"),
                          (["sac", "cheetah_walk"], "cheetah_walk")]:
        r = _run("profile", *args, timeout=300)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and message in lines[-1], (args, r.stderr[-800:])
        assert lines[-1].startswith("error:") and "Traceback" not in r.stderr, args


def test_benchmark_package_has_no_import_cycle_and_every_mode_its_four_names():
    """scripts/benchmarks/: the imports between its modules form no cycle and
    none imports the entry point (read from the source); each module imports
    alone in a fresh interpreter without JAX (so `--help` stays quick); every
    mode of benchmark.py's MODES provides HELP, DOC, add_arguments and run."""
    import ast
    import glob
    package = os.path.join(ROOT, "scripts", "benchmarks")
    names = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(package, "*.py")))
    graph = {}
    for name in names:
        edges = set()
        for node in ast.walk(ast.parse(open(os.path.join(package, f"{name}.py")).read())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:  # from . import x, from .x
                edges |= {node.module} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
                edges |= {a.name for a in node.names}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                    node.module or ""]
                assert "benchmark" not in mods, f"{name}.py imports the entry point"
                edges |= {m.split(".")[1] for m in mods if m.startswith("benchmarks.")}
        graph[name] = edges - {"__init__"}
    assert set().union(*graph.values()) <= set(names), graph
    done, path = set(), []

    def visit(n):  # depth-first; a module met again on the current path is a cycle
        assert n not in path, f"import cycle: {' -> '.join(path[path.index(n):] + [n])}"
        if n not in done:
            path.append(n)
            for m in sorted(graph[n]):
                visit(m)
            path.pop()
            done.add(n)
    for n in names:
        visit(n)
    check = ("import sys; sys.path.insert(0, 'scripts'); import benchmarks.{}; "
             "assert 'jax' not in sys.modules, 'imports JAX at the top'")
    for name in names:
        r = subprocess.run([sys.executable, "-c", check.format(name)], capture_output=True,
                           text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 0, (name, r.stderr[-1500:])
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import importlib
    import benchmark
    for mode, module in benchmark.MODES.items():
        m = importlib.import_module(f"benchmarks.{module}")
        assert all(callable(getattr(m, f, None)) for f in ("add_arguments", "run")), mode
        assert isinstance(m.HELP, str) and isinstance(m.DOC, str) and m.DOC.strip(), mode


def test_accelerator_update_quick_times_every_part_of_the_update():
    r = _run("accelerator", "update", "--quick", "--loop-iters", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("| 16 |"))
    times = [float(x) for x in row.strip("|").split("|")[1:]]
    assert len(times) == 6 and all(t > 0 for t in times), row  # mlp ... add


def test_accelerator_kernels_counts_each_update_against_the_bare_one():
    """`accelerator update --kernels`: the compiled update's kernels by kind,
    the bare MLP update first; an agent's update holds more (replay
    sampling draws random numbers, the bare update none) and its kinds sum
    to its total."""
    r = _run("accelerator", "update", "--quick", "--kernels")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    head = [c.strip() for c in next(ln for ln in lines if ln.startswith("| agent |"))
            .split("|")[1:-1]]
    rows = {c[0]: c for c in ([x.strip() for x in ln.split("|")[1:-1]]
                              for ln in lines if ln.startswith(("| bare", "| td3")))}
    bare, td3 = (dict(zip(head, rows[k])) for k in ("bare MLP update", "td3"))
    kinds = head[3:]
    for row in (bare, td3):
        assert int(row["kernels"]) == sum(int(row[k]) for k in kinds) > 0, row
    assert int(td3["kernels"]) > int(bare["kernels"]) and int(td3["rng"]) > 0 == int(bare["rng"])


def test_accelerator_ablations_time_the_update_whole_and_without_each_piece():
    """`accelerator update --ablations`: the bare update, then d4pg's update
    whole and with each piece taken out, each timed (the quick recipe has
    all the pieces, so every row is there)."""
    r = _run("accelerator", "update", "--quick", "--ablations")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in r.stdout.splitlines()
            if ln.startswith(("| bare", "| d4pg"))]
    names = [(a, v) for a, v, _, _ in rows]
    assert names == [("bare MLP update", ""), ("d4pg", "recipe"),
                     ("d4pg", "critic layer norm off"), ("d4pg", "observation normalisation off"),
                     ("d4pg", "replay gathers out"), ("d4pg", "all three off")], r.stdout
    assert all(float(ms) > 0 for _, _, ms, _ in rows) and rows[0][3] == "1.0", rows


def test_accelerator_sample_variants_times_every_form_of_replay_sample():
    r = _run("accelerator", "update", "--quick", "--sample-variants")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("| batch |"))
    row = next(ln for ln in lines if ln.startswith("| 16 |"))
    assert "reference" in head and "flat" in head, r.stdout
    times = [float(x) for x in row.strip("|").split("|")[1:]]
    assert len(times) == head.count("|") - 2 and all(t > 0 for t in times), row
    assert "mlp" not in r.stdout   # the forms of sample alone


def test_accelerator_split_probe_times_physics_work_and_both():
    r = _run("accelerator", "update", "--quick", "--split-probe")
    assert r.returncode == 0, r.stderr[-2000:]
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("| 16 |"))
    physics, work, in_order, split = (float(x) for x in row.strip("|").split("|")[1:])
    assert min(physics, work, in_order, split) > 0, row
    assert "mlp" not in r.stdout


def test_accelerator_profile_traces_a_running_command_and_summarises_it(tmp_path):
    """RL_PROFILE through the agent's own command: the run takes the trace
    after its compile, the runner stops it and reads the compiled program's
    ops (the CPU's XLA threads here, the device's op line on a chip)."""
    r = _run("accelerator", "profile", "--quick", "--algos", "td3", "--profile-at", "1",
             "--profile-seconds", "0.3", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "python algos/td3.py --env cartpole_balance, a 0.3 s trace from 1 s:" in r.stdout
    ops = re.findall(r"^\s+([\d.]+) ms\s+(\d+)x  (\S+)", r.stdout, re.M)
    assert any(name.startswith("while") and float(ms) > 0 for ms, _, name in ops), r.stdout
    assert any("host_call" in name for _, _, name in ops), r.stdout  # the physics' callbacks
    assert len(glob.glob(str(tmp_path / "profiles" / "*" / "**" / "*.trace.json.gz"),
                         recursive=True)) == 1


def test_accelerator_table_reads_the_last_evaluation_within_each_mark(tmp_path):
    """2.5, 5 and 10 minutes from the process's start; a run stopped at 9.2
    minutes shows its last evaluation (one logged after the stop, while the
    run closed, too, unless it overlapped physics) under 10 min."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from benchmarks import accelerator
    seconds, returns, steps = [100.0, 140.0, 290.0, 315.0, 555.0, 601.0], \
        [1.0, 50.0, 300.0, 400.0, 500.0, 999.0], [1, 2, 3, 4, 5, 6]
    marks = accelerator.at_marks(seconds, returns, steps)
    assert marks == [(50.0, 2), (300.0, 3), (500.0, 5)]   # 601 s is past 10 minutes
    row = dict(task="humanoid_walk", algo="d4pg", command="python algos/d4pg.py", machine="m",
               sps=1000.0, first_log_s=50.0, minutes=9.2, eval_seconds=seconds,
               eval_returns=returns, eval_steps=[4_000_000, 5_000_000, 6_000_000, 7_000_000,
                                                 8_000_000, 9_000_000],
               config=dict(overlap_physics=False))
    # an overlapped run's evaluation after its stop signal (555 s > 552 s) is not read:
    # the signal broke such runs' last chunk before runs stopped at once on it
    overlapped = dict(row, config=dict(overlap_physics=True))
    text = accelerator.write_table([row, overlapped], str(tmp_path))
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()[-2:]]
    assert cells[0][5:] == ["9.2", "50 (5.0M)", "300 (6.0M)", "500 (8.0M)"]
    assert cells[1][5:] == ["9.2", "50 (5.0M)", "300 (6.0M)", "400 (7.0M)"]
    assert (tmp_path / "table.md").exists()


def test_accelerator_run_command_shows_a_candidate_recipe_not_the_runner_flags():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from benchmarks import accelerator
    cmd = accelerator.run_command("humanoid_run", "d4pg", 500_000, ["--num-envs", "1024"],
                                  ["--hidden-sizes", "8"])
    shown = accelerator.shown_command(cmd)
    assert shown == "python algos/d4pg.py --env humanoid_run --num-envs 1024"
    assert cmd[-2:] == ["--hidden-sizes", "8"] and "--eval-every" in cmd
    assert accelerator.shown_command(accelerator.run_command("humanoid_walk", "td3", 1, [], [])) \
        == "python algos/td3.py --env humanoid_walk"


def test_accelerator_run_keeps_its_training_curves_thinned(tmp_path):
    """A device run's event files stay on the device: its JSON keeps each
    training metric (losses/, stats/, the training return) at <= 40 chunks."""
    from tensorboardX import SummaryWriter
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from benchmarks import accelerator
    w = SummaryWriter(str(tmp_path))
    for k in range(100):
        w.add_scalar("losses/approx_kl", k / 100, 1000 * k)
        w.add_scalar("charts/sps", 5.0, 1000 * k)
    w.add_scalar("eval/episode_return", 3.0, 99_000)
    w.close()
    curves = accelerator.training_curves(str(tmp_path), {"losses/approx_kl", "charts/sps",
                                                         "eval/episode_return"})
    assert list(curves) == ["losses/approx_kl"]
    kl = curves["losses/approx_kl"]
    assert len(kl["steps"]) == 40 and kl["steps"][0] == 0 and kl["steps"][-1] == 99_000
    assert kl["values"] == pytest.approx([s / 100_000 for s in kl["steps"]])


def test_accelerator_agent_rows_name_their_envs_batch_and_update_ratio():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from benchmarks import accelerator
    row = dict(algo="d4pg", envs=1024, batch=2048, ups=1 / 64, ms_update=0.5, ms_acting=0.02,
               ms_loop=0.025, efficiency=0.3)
    cells = [c.strip() for c in accelerator.agents_table([row]).splitlines()[-1].split("|")[1:-1]]
    assert cells == ["d4pg", "1024", "2048", "1/64", "no", "0.500", "20.0", "25.0", "40,000",
                     "0.30"]
    cells = accelerator.agents_table([dict(row, overlap=True)]).splitlines()[-1].split("|")
    assert cells[5].strip() == "yes"
    from common.errors import UserError
    with pytest.raises(UserError, match="loop-ups"):  # above one update per env step
        accelerator.run(accelerator_args("update", "--loop-ups", "2"))


def test_accelerator_seeds_reads_the_last_progress_line_and_scales_by_the_seed_count():
    """`accelerator seeds`: a run's last progress line gives env steps and
    env steps/s per seed (the bar rewrites itself with \\r); the table shows
    the total over all seeds and its ratio to the first program's."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from benchmarks import accelerator
    text = ("physics: native\n[#-----]    262144/1000000000 steps    18000 steps/s  return 1.0"
            "\r[##----]    524288/1000000000 steps    19875 steps/s  return 2.0  eval nan\n")
    assert accelerator.last_progress(text) == (524288, 19875.0)
    assert accelerator.last_progress("compiling...\n") is None
    rows = [dict(seeds=1, steps_per_seed=524288, sps_per_seed=20000.0, sps_total=20000.0),
            dict(seeds=4, steps_per_seed=262144, sps_per_seed=15000.0, sps_total=60000.0)]
    for r in rows:
        r["scaling"] = r["sps_total"] / rows[0]["sps_total"]
    table = accelerator.seeds_table(dict(algo="d4pg", task="humanoid_walk", machine="m",
                                         rows=rows))
    cells = [c.strip() for c in table.splitlines()[-1].split("|")[1:-1]]
    assert cells == ["4", "262,144", "15,000", "60,000", "3.00"]
    from common.errors import UserError
    with pytest.raises(UserError, match="seed-counts"):
        accelerator.run(accelerator_args("seeds", "--seed-counts", "0", "4"))


def accelerator_args(*argv):
    import argparse
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from benchmarks import accelerator
    p = argparse.ArgumentParser()
    accelerator.add_arguments(p)
    return p.parse_args(list(argv))


def test_train_member_axis_times_one_member_both_ways():
    """`train --member-axis`: per agent, one seed's run as the command line
    compiles it and vmapped over a member axis of 1, both timed."""
    r = _run("train", "--member-axis", "--quick", "--algos", "td3", "ppo", "--member-steps", "2048")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [ln for ln in r.stdout.splitlines() if re.match(r"\| (td3|ppo) \|", ln)]
    assert [ln.split("|")[1].strip() for ln in rows] == ["td3", "ppo"], r.stdout
    for ln in rows:
        one, vmapped, ratio = (float(x.replace(",", "")) for x in ln.strip("|").split("|")[3:])
        assert one > 0 and vmapped > 0 and ratio == pytest.approx(one / vmapped, abs=0.01), ln


def test_accelerator_group_probe_times_the_step_in_staggered_groups():
    """(The groups' states are the whole step's: tests/test_overlap.py.)"""
    r = _run("accelerator", "update", "--quick", "--group-probe")
    assert r.returncode == 0, r.stderr[-2000:]
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("| 16 |"))
    assert len(row.strip("|").split("|")) == 4 and all(
        float(x) > 0 for x in row.strip("|").split("|")[1:]), row


def test_chunk_breakdown_sums_a_chunks_leaf_ops_by_kind_and_scope():
    """Two chunks of 100 us: a while op holding two fusions of the update,
    then a transfer wait; the chunk's 10 us in no leaf op."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from benchmarks import accelerator
    ops, chunks = [], []
    for t in (0, 200):
        chunks.append(dict(name="conditional.1", ts=t, dur=100))
        ops += [chunks[-1], dict(name="while.2", ts=t, dur=60),
                dict(name="fusion.3", ts=t, dur=30,
                     args=dict(tf_op="jit(run)/while/body/update/dot_general")),
                dict(name="fusion.4", ts=t + 30, dur=30,
                     args=dict(tf_op="jit(run)/while/body/update/dot_general")),
                dict(name="recv-done.5", ts=t + 60, dur=30)]
    lines = accelerator.chunk_breakdown(ops, chunks)
    assert "mean over 2, chunk 0.10 ms; in no leaf op 0.01 ms" in lines[0], lines
    rows = [ln.split() for ln in lines[1:]]
    assert rows == [["0.060", "ms", "fusion", "update/dot_general"],
                    ["0.030", "ms", "recv-done"]], lines
