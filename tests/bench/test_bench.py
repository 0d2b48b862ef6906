"""`normprop bench` on a tiny configuration: its columns and its arithmetic, never its timings."""

import math

import pandas as pd
import pytest
import torch

from normprop_cli.bench import COLUMNS, EPOCH_COLUMNS, denormals_flushed, run_bench
from normprop_cli.engine.step import PHASES


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    table = run_bench(batch_sizes=(1, 4), widths=(0.0625,), steps=3, warmup=1, device="cpu",
                      results_dir=out, epochs=1, preset="smoke", quiet=True)  # fmt: skip
    return table, out


def test_bench_writes_the_table_it_returns(bench):
    table, out = bench
    assert list(table.columns) == COLUMNS
    on_disk = pd.read_csv(out / "bench" / "bench.csv")
    assert list(on_disk.columns) == COLUMNS and len(on_disk) == len(table) == 6
    assert sorted(table["method"].unique()) == ["batchnorm", "none", "normprop"]
    assert set(table["batch_size"]) == {1, 4} and set(table["width"]) == {0.0625}
    assert (table["steps"] == 3).all() and table["finite"].all()
    assert (table["step_ms_median"] > 0).all()
    phases = table[[f"{p}_ms_median" for p in PHASES]]  # on the CPU every phase of every step is timed
    assert phases.notna().all(axis=None) and (phases >= 0).all(axis=None)


def test_ratios_are_the_medians_divided(bench):
    table, _ = bench
    for _, group in table.groupby(["width", "batch_size"]):
        med = group.set_index("method")["step_ms_median"]
        for method, row in group.set_index("method").iterrows():
            assert row["ratio_vs_none"] == pytest.approx(med[method] / med["none"])
            assert row["ratio_vs_batchnorm"] == pytest.approx(med[method] / med["batchnorm"])
        assert group.set_index("method").loc["none", "ratio_vs_none"] == 1.0
        assert (group["step_ms_p10"] <= group["step_ms_median"] + 1e-9).all()


def test_epoch_shares_add_up(bench):
    table, out = bench
    epochs = table.attrs["epochs"]
    assert list(epochs.columns) == EPOCH_COLUMNS and len(epochs) == 3
    assert list(pd.read_csv(out / "bench" / "epochs.csv").columns) == EPOCH_COLUMNS
    for row in epochs.itertuples():
        assert 0 < row.steps_s <= row.train_s <= row.epoch_s
        assert 0 <= row.outside_share <= 1
        assert math.isclose(row.outside_share, row.data_share + row.eval_share, abs_tol=1e-9)


def test_denormals_are_flushed_on_the_cpu():
    from normprop_cli import device

    device.prepare(torch.device("cpu"))
    assert denormals_flushed(torch.device("cpu"))
