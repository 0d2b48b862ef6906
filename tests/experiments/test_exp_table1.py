"""Table 1 (section 5.5): test error per method and augmentation, beside the paper's where it has one."""

import pandas as pd
import pytest

from normprop_cli import config
from normprop_cli.experiments import table1


@pytest.fixture(scope="module")
def results(trained, tmp_path_factory):
    return trained(
        tmp_path_factory.mktemp("table1") / "results", "table1", "--preset", "smoke", "--quiet", "train.epochs=1"
    )


def test_one_row_per_run_with_its_augmentation_and_the_papers_error(results):
    summary = pd.read_csv(results / "table1" / "synthetic" / "summary.csv")
    assert list(summary.columns[-2:]) == ["augment", "paper_test_error"]
    assert summary.groupby(["method", "augment"]).size().to_dict() == {
        (method, augment): 1 for method in ("batchnorm", "normprop") for augment in ("none", "translate")
    }
    assert summary["paper_test_error"].isna().all()  # the paper has no Table 1 on synthetic data


def test_plot_redraws_from_the_csvs_alone(assert_redraws, results):
    assert_redraws("table1", results)


def test_headlines_put_the_papers_error_beside_labelled_as_not_comparable(results, tmp_path):
    rows = table1.headlines(config.load("table1", preset="smoke", results_dir=str(results)))
    finals = [r for r in rows if r["quantity"].startswith("final test error")]
    assert len(finals) == 4 and all("95% CI, n = 1" in r["quantity"] for r in finals)
    assert all(r["paper"] == "" for r in finals)  # no Table 1 on synthetic data
    # digits: CIFAR-10's number (the YAML's), labelled as not comparable
    published = config.load("table1").experiment.paper_test_error.cifar10.normprop.none
    summary = pd.read_csv(results / "table1" / "synthetic" / "summary.csv")
    (tmp_path / "table1" / "digits").mkdir(parents=True)
    summary.assign(paper_test_error=published).to_csv(tmp_path / "table1" / "digits" / "summary.csv", index=False)
    rows = table1.headlines(config.load("table1", preset="smoke", dataset="digits", results_dir=str(tmp_path)))
    assert rows[0]["paper"] == f"{published} (cifar10; not comparable with digits)"


def test_figure_names_the_augmentation_the_seeds_and_what_a_bar_is(results, drawn, legend_texts):
    table1.plot(config.load("table1", preset="smoke", results_dir=str(results)))
    ax = drawn["table1"].axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert (
        sum("no augmentation" in t for t in ticks) == 2 and sum("random shifts (up to 3 px)" in t for t in ticks) == 2
    )
    assert all("n = 1" in t for t in ticks) and "augmentation" in ax.get_xlabel() and "%" in ax.get_ylabel()
    assert "bar: mean over seeds" in ax.get_title() and "interval" not in ax.get_title()  # 1 seed: no interval
    assert "NormProp: this reproduction, mean of 1 seed" in legend_texts(drawn["table1"])
    assert "this reproduction, one seed" in legend_texts(drawn["table1"])


def test_figure_with_seeds_shows_their_interval_and_the_paper_beside(results, tmp_path, drawn, legend_texts):
    from matplotlib.container import ErrorbarContainer

    summary = pd.read_csv(results / "table1" / "synthetic" / "summary.csv")
    seeds = pd.concat([summary.assign(seed=s, final_test_error=summary["final_test_error"] + s) for s in range(3)])
    (tmp_path / "table1" / "synthetic").mkdir(parents=True)
    seeds.assign(paper_test_error=9.11).to_csv(tmp_path / "table1" / "synthetic" / "summary.csv", index=False)
    table1.plot(config.load("table1", preset="smoke", results_dir=str(tmp_path)))
    ax = drawn["table1"].axes[0]
    assert "whisker: 95% interval of the mean" in ax.get_title()
    assert sum(isinstance(c, ErrorbarContainer) for c in ax.containers) == 4  # one whisker per bar
    assert {"BatchNorm: this reproduction, mean of 3 seeds", "paper (Table 1, same data set)"} <= set(
        legend_texts(drawn["table1"])
    )
    assert all("n = 3" in t.get_text() for t in ax.get_xticklabels())
