"""What the user gives is honoured or refused, never silently dropped: overrides of a grid's
keys, wrongly typed values, a training split smaller than a batch, a results directory that cannot be
written, and `normprop config`."""

import pytest
import yaml

SMOKE = ["--preset", "smoke", "--quiet"]


def one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_an_honoured_override_shows_in_every_run_config(cli):
    """data-norm's grid sets train.lr per setting; train.lr=0.3 replaces it in every run."""
    result = cli("run", "data-norm", *SMOKE, "--seeds", "1", "train.epochs=1", "train.lr=0.3",
                 "--results-dir", cli.results)  # fmt: skip
    assert result.exit_code == 0, result.output
    configs = sorted((cli.results / "data-norm" / "synthetic" / "runs").glob("*/config.yaml"))
    assert len(configs) == 4
    assert {yaml.safe_load(p.read_text())["train"]["lr"] for p in configs} == {0.3}


@pytest.mark.parametrize(
    "experiment,override,needle",
    [
        ("table1", "model.norm=batchnorm", "model.norm"),  # what the grid compares
        ("convergence", "model.norm=none", "model.norm"),
        ("data-norm", "train.batch_size=8", "train.batch_size"),
        ("batch-size", "train.lr=0.1", "lr_sweep"),  # the validation sweep chooses it
        ("normalizers", "model.norm=groupnorm", "experiment.methods"),
    ],
)
def test_an_override_of_what_the_grid_compares_is_refused(cli, experiment, override, needle):
    one_line_error(
        cli("run", experiment, *SMOKE, override, "--results-dir", cli.results), "cannot be overridden", needle
    )
    assert not cli.results.exists()


@pytest.mark.parametrize(
    "override,needle",
    [
        ("train.batch_size=abc", "train.batch_size=abc is not a whole number"),
        ("train.lr=fast", "train.lr=fast is not a number"),
        ("train.epochs=2.5", "train.epochs=2.5 is not a whole number"),
        ("train.augment=maybe", "train.augment=maybe is not true or false"),
        ("train.momentum=[0.9]", "is not a number"),
        ("model.width=wide", "model.width=wide is not a number"),
        ("seeds=two", "seeds=two is not a whole number"),
        ("dataset.split_seed=x", "dataset.split_seed=x is not a whole number"),
        ("experiment.band=narrow", "experiment.band=narrow is not a number"),
        ("dataset.limit=abc", "limit"),
    ],
)
def test_a_wrongly_typed_value_is_a_one_line_error(cli, override, needle):
    one_line_error(cli("run", "covariate-shift", *SMOKE, override, "--results-dir", cli.results), needle)
    assert not cli.results.exists()


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-0.1"])
def test_a_rate_that_is_not_a_positive_finite_number_is_refused_before_training(cli, value):
    result = cli("run", "table1", *SMOKE, f"train.lr={value}", "--results-dir", cli.results)
    one_line_error(result, "train.lr must be a positive finite number")
    assert not list(cli.results.rglob("manifest.json"))


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_training_split_smaller_than_a_batch_is_refused_before_training(cli, jobs):
    """The smoke data set has 64 training images; a batch of 100 would make an epoch of no steps."""
    result = cli("run", "convergence", *SMOKE, "--jobs", jobs, "train.batch_size=100", "--results-dir", cli.results)
    one_line_error(result, "64 image(s), fewer than train.batch_size=100")
    assert not list(cli.results.rglob("manifest.json"))


def test_config_prints_every_run_and_trains_nothing(cli):
    result = cli("config", "covariate-shift", "--preset", "smoke", "--seeds", "2", "train.lr=0.3",
                 "--results-dir", cli.results)  # fmt: skip
    assert result.exit_code == 0, result.output
    runs = [line.split()[-1] for line in result.output.splitlines() if line.startswith("# run ")]
    assert runs == ["normprop-s0", "normprop-s1", "batchnorm-s0", "batchnorm-s1", "none-s0", "none-s1"]
    docs = [yaml.safe_load(part.split("\n", 1)[1]) for part in result.output.split("# run ")[1:]]
    assert [d["train"]["lr"] for d in docs] == [0.3] * 6
    assert [d["model"]["norm"] for d in docs] == ["normprop"] * 2 + ["batchnorm"] * 2 + ["none"] * 2
    assert not cli.results.exists()


def test_config_refuses_what_run_refuses(cli):
    one_line_error(cli("config", "table1", "model.norm=none"), "model.norm")


def test_a_results_dir_that_cannot_be_written_is_a_one_line_error(cli, tmp_path):
    """Under a plain file no directory can be made, whoever runs the tests (root ignores permissions)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = cli("run", "convergence", *SMOKE, "--seeds", "1", "--results-dir", blocker / "results")
    one_line_error(result, "cannot write results in", "--results-dir")
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize("plus", ["+", "++"])
@pytest.mark.parametrize(
    "override,meant",
    [("train.epoch=3", "train.epochs=3"), ("epochs=3", "train.epochs=3"), ("model.widht=8", "model.width=8")],
)
def test_a_plus_override_of_a_key_the_config_lacks_is_refused_like_a_typo(cli, plus, override, meant):
    """Hydra's `+key=value` would add the key and train without it; refused as the same typo without `+` is."""
    result = cli("run", "convergence", *SMOKE, "--seeds", "1", plus + override, "--results-dir", cli.results)
    key = override.split("=")[0]
    one_line_error(result, f"unknown key '{key}'", f"did you mean `{meant}`?")
    assert not cli.results.exists()


def test_a_plus_override_of_a_key_the_config_has_is_refused(cli):
    """`+train.epochs=1`: Hydra cannot add a key that exists; a one-line error, nothing written."""
    result = cli("run", "convergence", *SMOKE, "--seeds", "1", "+train.epochs=1", "--results-dir", cli.results)
    one_line_error(result, "bad override")
    assert not cli.results.exists()


def test_version_prints_the_package_version_and_exits_0(cli):
    import normprop_cli

    result = cli("--version")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"normprop {normprop_cli.__version__}"


def test_list_aligns_each_groups_descriptions_two_spaces_after_its_longest_name(cli):
    result = cli("list")
    assert result.exit_code == 0, result.output
    groups: dict[str, list[str]] = {}
    for line in result.output.splitlines():
        if not line.startswith("  "):
            groups[line] = []
        groups[list(groups)[-1]] += [line] if line.startswith("  ") else []
    assert len(groups) == 4 and all(groups.values()), list(groups)
    for heading, rows in groups.items():
        names = [row.split()[0] for row in rows]
        column = 2 + max(map(len, names)) + 2
        for row, name in zip(rows, names, strict=True):
            assert row[:column] == f"  {name}".ljust(column) and row[column] != " ", (heading, row)
    assert "README" not in result.output  # configs point at docs/performance.md, not a README heading
