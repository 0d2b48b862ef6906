"""`normprop run --dry-run` and `normprop reproduce-all --dry-run`: the plan before training. It trains
nothing and writes nothing but plan.csv; its counts are the grid's, sweeps included, by hand; a run
finished on disk is left out, an unfinished one counted from where it resumes."""

import json

import pandas as pd
import pytest
from omegaconf import OmegaConf

from normprop_cli import config
from normprop_cli.data.sizes import split_sizes
from normprop_cli.engine.runs import METRIC_COLUMNS
from normprop_cli.engine.trainer import build_model
from normprop_cli.experiments import EXPERIMENTS
from normprop_cli.nn.methods import METHODS

SMOKE = ["--preset", "smoke"]
WIDTH = 0.0625  # the smoke preset's NIN


def tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def step_times(tmp_path):
    """A step-times CSV for the smoke preset: batch-size's keys (method, batch, width) with round times,
    and every method at batch 1 and 64 for the rest (interpolated between)."""
    rows = [("normprop-icml", 1, 3.0), ("normprop-icml", 16, 6.0), ("normprop-icml", 64, 19.2),
            ("batchnorm", 1, 6.0), ("batchnorm", 64, 38.4)]  # fmt: skip
    rows += [(m, b, 5.0 * b) for m in METHODS for b in (1, 64) if m not in ("normprop-icml", "batchnorm")]
    frame = pd.DataFrame(rows, columns=["method", "batch_size", "step_ms"])
    frame = pd.concat([frame.assign(width=w) for w in (WIDTH, 0.125)], ignore_index=True)
    path = tmp_path / "times.csv"
    path.write_text("# made up for the tests\n" + frame.to_csv(index=False))
    return path


def dry_run(cli, step_times):
    return cli("run", "batch-size", *SMOKE, "--dry-run", "--step-times", step_times, "--results-dir", cli.results)


def plan_of(results):
    return pd.read_csv(results / "plan.csv").set_index("experiment")


def test_a_dry_run_trains_nothing_and_writes_only_plan_csv(cli, tmp_path, step_times):
    before = tree(tmp_path)
    result = dry_run(cli, step_times)
    assert result.exit_code == 0, result.output
    assert tree(tmp_path) == sorted([*before, "results", "results/plan.csv"])
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("plan: 6 run(s) + 6 sweep run(s) to train, 792 SGD steps")
    assert lines[1] == f"wrote {cli.results / 'plan.csv'}" and len(lines) == 3
    assert lines[2] == "plan of the first round: 6 run(s) to train; 0 finished: reused"  # the sweep's, in the engine


def test_the_counts_are_the_grids_by_hand(cli, step_times):
    """batch-size, smoke: 64 images a split; NormProp at batch 1 and 16, BatchNorm at 1; 2 seeds x 2
    epochs; the factors sweep: 2 rates x 1 seed x 1 epoch per setting."""
    assert dry_run(cli, step_times).exit_code == 0
    row = plan_of(cli.results).loc["batch-size"]
    steps = {1: 64, 16: 4}  # per epoch: 64 images // batch
    main = {("normprop-icml", 1): 2 * 2 * steps[1], ("normprop-icml", 16): 2 * 2 * steps[16],
            ("batchnorm", 1): 2 * 2 * steps[1]}  # fmt: skip
    sweep = {k: 2 * 1 * steps[k[1]] for k in main}
    assert (row.runs, row.sweep_runs, row.sweep_runs_max) == (6, 6, 6)
    assert row.sgd_steps == sum(main.values()) + sum(sweep.values()) == 792
    assert row.train_images == sum((main[k] + sweep[k]) * k[1] for k in main)
    assert row.eval_images == (6 * 2 + 6 * 1) * (64 + 64)
    ms = {("normprop-icml", 1): 3.0, ("normprop-icml", 16): 6.0, ("batchnorm", 1): 6.0}
    per_image = {"normprop-icml": 19.2 / 64 / 3, "batchnorm": 38.4 / 64 / 3}  # a forward: a third of a step
    evals = {k: (2 * 2 + 2 * 1) * 128 for k in main}  # images scored by the runs and the sweep's of a setting
    seconds = sum((main[k] + sweep[k]) * ms[k] + evals[k] * per_image[k[0]] for k in main) / 1e3
    assert row.est_seconds == pytest.approx(seconds, abs=0.06)
    cfg = config.load("batch-size", preset="smoke")

    def state(norm):
        class Shapes:
            num_classes, in_channels = 10, 3

        model = build_model(OmegaConf.merge(cfg.model, {"norm": norm}), Shapes(), 1)
        state = sum(v.numel() * v.element_size() for v in model.state_dict().values())  # BN's counters: int64
        return state + sum(p.numel() * 4 for p in model.parameters())  # and SGD's momentum

    assert row.disk_bytes == 8 * state("normprop") + 4 * state("batchnorm")


def fake_run(results, name, status, epochs_done):
    path = results / "batch-size" / "synthetic" / "runs" / name
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"run": name, "status": status, "epochs_done": epochs_done}))
    rows = [dict.fromkeys(METRIC_COLUMNS, 1.0) | {"epoch": e + 1} for e in range(epochs_done)]
    pd.DataFrame(rows, columns=METRIC_COLUMNS).to_csv(path / "metrics.csv", index=False)


def test_finished_runs_are_left_out_and_an_unfinished_one_counts_its_epochs_left(cli, step_times):
    fake_run(cli.results, "normprop-b16-s0", "complete", 2)
    fake_run(cli.results, "batchnorm-b1-s1", "diverged", 1)
    fake_run(cli.results, "normprop-b1-s0", "running", 1)
    fake_run(cli.results, "sweep-normprop-b1-lr0.002-s0", "complete", 1)
    before = tree(cli.results)
    assert dry_run(cli, step_times).exit_code == 0
    row = plan_of(cli.results).loc["batch-size"]
    assert (row.runs, row.sweep_runs) == (6 - 2, 6 - 1)
    assert row.sgd_steps == 792 - 2 * 4 - 2 * 64 - 64 - 64
    assert tree(cli.results) == sorted([*before, "plan.csv"])  # the runs untouched


def test_a_finished_run_at_the_rate_its_sweep_chose_is_left_out_not_refused(cli, step_times):
    """A swept experiment plans its runs at the centre rate; a finished run trained at the rate the sweep
    chose instead differs in train.lr alone, and is left out as finished. Any other difference is refused."""
    from normprop_cli.engine import expand_grid
    from normprop_cli.experiments.plan import configs, each_setting

    cfg = next(c for c, _ in configs("smoke") if c.experiment.name == "batch-size")
    assert cfg.experiment.get("lr_sweep") is not None
    spec = next(s for one in each_setting(cfg) for s in expand_grid(one) if s.name == "normprop-b16-s0")
    fake_run(cli.results, spec.name, "complete", 2)
    stored = OmegaConf.masked_copy(spec.run_cfg, list(spec.run_cfg))
    stored.train.lr = 2 * float(spec.run_cfg.train.lr)
    written = cli.results / "batch-size" / "synthetic" / "runs" / spec.name / "config.yaml"
    written.write_text(OmegaConf.to_yaml(stored))
    assert dry_run(cli, step_times).exit_code == 0
    assert plan_of(cli.results).loc["batch-size"].runs == 6 - 1
    stored.train.momentum = 0.5
    written.write_text(OmegaConf.to_yaml(stored))
    result = dry_run(cli, step_times)
    assert result.exit_code == 2 and "train.momentum" in result.output and "train.lr" in result.output


def test_reproduce_all_plans_every_experiment_and_their_total(cli, tmp_path, step_times):
    before = tree(tmp_path)
    result = cli("reproduce-all", *SMOKE, "--dry-run", "--step-times", step_times, "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    assert tree(tmp_path) == sorted([*before, "results", "results/plan.csv"])
    frame = pd.read_csv(cli.results / "plan.csv")
    assert list(frame["experiment"]) == [*EXPERIMENTS, "total"]  # reproduce-all's order
    body, total = frame.iloc[:-1], frame.iloc[-1]
    for column in ("runs", "sweep_runs", "sgd_steps", "eval_images", "disk_bytes"):
        assert total[column] == body[column].sum()
    assert total["est_seconds"] == pytest.approx(body["est_seconds"].sum(), abs=0.1)
    assert body.set_index("experiment").loc["theory", "runs"] == 0
    assert f"plan: {int(total.runs)} run(s)" in result.output


def test_a_step_times_file_without_a_configuration_is_a_one_line_error(cli, tmp_path):
    path = tmp_path / "times.csv"
    path.write_text("method,batch_size,width,step_ms\nnormprop-icml,1,0.0625,3.0\n")
    result = cli("run", "batch-size", *SMOKE, "--dry-run", "--step-times", path, "--results-dir", cli.results)
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert "no step time for" in line and "batchnorm at batch 1" in line
    assert not cli.results.exists()


def test_a_dry_run_times_its_steps_here_without_a_file(cli, tmp_path):
    grid = "grid=[{id: a, set: {model.norm: normprop}}]"
    result = cli("run", "table1", *SMOKE, "--dry-run", "--seeds", 1, grid, "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    assert tree(tmp_path) == ["results", "results/plan.csv"]
    assert "1 run(s) to train, 8 SGD steps" in result.output and "timed on cpu" in result.output
    assert plan_of(cli.results).loc["table1", "est_seconds"] > 0


def test_a_run_says_its_estimate_before_it_trains(cli, step_times):
    grid = "grid=[{id: a, set: {model.norm: normprop}}]"
    args = ["run", "table1", *SMOKE, "train.epochs=1", grid, "--step-times", step_times, "--results-dir", cli.results]
    result = cli(*args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    plan = [i for i, line in enumerate(lines) if line.startswith("plan: 1 run(s) to train, 4 SGD steps")]
    trained = [i for i, line in enumerate(lines) if "wrote" in line]
    assert plan and trained and plan[0] < trained[0]
    assert not (cli.results / "plan.csv").exists()
    again = cli(*args)  # nothing left to train: no estimate
    assert again.exit_code == 0 and "plan:" not in again.output


def test_split_sizes_come_from_the_loaders_rules_without_the_data():
    assert split_sizes("cifar10") == (45_000, 5_000, 10_000, (3, 32, 32))
    assert split_sizes("cifar100")[:3] == (45_000, 5_000, 10_000)
    assert split_sizes("svhn")[:3] == (73_257 + 531_131 - 6_000, 6_000, 26_032)
    assert split_sizes("fashion-mnist") == (55_000, 5_000, 10_000, (1, 32, 32))
    assert split_sizes("synthetic", limit=64) == (64, 64, 64, (3, 32, 32))
    assert split_sizes("cifar10", train_limit=5_000)[:3] == (5_000, 5_000, 10_000)
