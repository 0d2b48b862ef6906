"""`normprop bench` on a tiny configuration: its columns and its arithmetic, never its timings."""

import math
import statistics

import pandas as pd
import pytest
import torch

from normprop_cli import device as devices
from normprop_cli.bench import PRECISIONS, bench_data, choose_methods, choose_precisions, run_bench
from normprop_cli.bench.timing import COLUMNS, EPOCH_COLUMNS, build_step, denormals_flushed
from normprop_cli.engine.step import PHASES, StepOptions
from normprop_cli.nn.methods import METHODS, model_options

TIMED = ("none", "batchnorm", "normprop-icml")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    table = run_bench(batch_sizes=(1, 4), widths=(0.0625,), steps=3, warmup=1, device="cpu",
                      results_dir=out, epochs=1, preset="smoke", quiet=True,
                      precisions=PRECISIONS, methods=TIMED)  # fmt: skip
    return table, out


def test_bench_writes_the_table_it_returns(bench):
    table, out = bench
    assert list(table.columns) == COLUMNS
    on_disk = pd.read_csv(out / "bench" / "bench.csv")
    assert list(on_disk.columns) == COLUMNS and len(on_disk) == len(table) == 12
    assert tuple(table["method"].unique()) == TIMED  # METHODS' names, in METHODS' order
    assert table.groupby("precision").size().to_dict() == {"bfloat16": 6, "float32": 6}
    assert (table["options"] == "channels_last").all()  # the precision is not an option of its own
    assert set(table["batch_size"]) == {1, 4} and set(table["width"]) == {0.0625}
    assert (table["steps"] == 3).all() and table["finite"].all()
    assert (table["step_ms_median"] > 0).all()
    ops = table.set_index(["method", "batch_size", "precision"])["ops_per_step"]
    assert (ops > 0).all() and (ops == ops.round()).all()  # whole calls: every step makes the same ones
    phases = table[[f"{p}_ms_median" for p in PHASES]]  # on the CPU every phase of every step is timed
    assert phases.notna().all(axis=None) and (phases >= 0).all(axis=None)


def test_ratios_are_paired_by_round_with_an_interval_around_them(bench):
    """Each ratio is the median of per-round ratios (the reference's own is exactly 1); with 3 timed
    steps the interval is undefined (a 95% order-statistic interval needs 6), so it is empty."""
    table, _ = bench
    for _, group in table.groupby(["width", "batch_size", "precision"]):
        rows = group.set_index("method")
        assert rows.loc["none", "ratio_vs_none"] == 1.0 and rows.loc["batchnorm", "ratio_vs_batchnorm"] == 1.0
        assert (rows["ratio_vs_none"] > 0).all() and rows["ratio_vs_none_low"].isna().all()
        assert (rows["fastest_independent"] == "normprop-icml").all()  # the one batch-independent normaliser
        assert rows.loc["normprop-icml", "ratio_vs_fastest_independent"] == 1.0
        assert (group["step_ms_p10"] <= group["step_ms_median"] + 1e-9).all()


def test_a_paired_ratio_is_the_median_of_the_rounds_with_its_binomial_interval():
    from normprop_cli.bench.timing import paired_ratio

    steps = [2.0 * (1 + 0.01 * k) for k in range(100)]
    reference = [1.0] * 100
    mid, low, high = paired_ratio(steps, reference)
    ratios = sorted(steps)
    assert mid == pytest.approx((ratios[49] + ratios[50]) / 2)
    assert (low, high) == (ratios[39], ratios[60])  # n = 100: the 40th and the 61st order statistics
    drift = [2.0 * 1.5**k for k in range(40)]  # the machine slows down: both sides of every round alike
    assert paired_ratio(drift, [d / 2 for d in drift]) == (2.0, 2.0, 2.0)


def test_the_fastest_independent_normaliser_is_a_paired_reference_computed_by_hand():
    """On made-up per-round times: none and batchnorm are the fastest, yet the reference is the batch-independent
    normaliser with the lowest median step (layernorm), and every ratio is the median of the round ratios."""
    from normprop_cli.bench.timing import fastest_independent, paired_ratio, reference_ratios

    times = {"none": [1.0, 1.0, 1.0], "batchnorm": [2.0, 2.0, 2.0], "layernorm": [4.0, 3.0, 5.0],
             "normprop-icml": [5.0, 6.0, 4.5], "online": [10.0, 9.0, 10.0]}  # fmt: skip
    assert fastest_independent(times) == "layernorm"  # medians 4 < 5 < 9; none's 1 and batchnorm's 2 don't count
    ratios = reference_ratios(times)
    assert {r["fastest_independent"] for r in ratios.values()} == {"layernorm"}
    assert ratios["layernorm"]["ratio_vs_fastest_independent"] == 1.0
    assert ratios["normprop-icml"]["ratio_vs_fastest_independent"] == 1.25  # median of 5/4, 6/3, 4.5/5
    assert ratios["batchnorm"]["ratio_vs_fastest_independent"] == 0.5  # median of 2/4, 2/3, 2/5
    assert ratios["online"]["ratio_vs_fastest_independent"] == 2.5  # median of 10/4, 9/3, 10/5
    many = {"layernorm": [1.0 + k % 7 for k in range(50)], "groupnorm": [3.0 + k % 5 for k in range(50)]}
    low_high = reference_ratios(many)["groupnorm"]
    expected = paired_ratio(many["groupnorm"], many["layernorm"])  # the interval is paired_ratio's, as vs none
    assert tuple(low_high[f"ratio_vs_fastest_independent{end}"] for end in ("", "_low", "_high")) == expected
    assert not math.isnan(expected[1])
    plain = reference_ratios({"none": [1.0], "batchnorm": [2.0], "batchrenorm": [3.0]})
    assert fastest_independent({"none": [1.0], "batchnorm": [2.0]}) is None
    for row in plain.values():  # no batch-independent normaliser timed: the columns are empty
        assert row["fastest_independent"] is None and math.isnan(row["ratio_vs_fastest_independent"])
        assert all(math.isnan(row[f"ratio_vs_fastest_independent{end}"]) for end in ("_low", "_high"))


def test_a_bench_takes_its_fastest_independent_normaliser_at_each_configuration(tmp_path, monkeypatch):
    """A tiny bench: the reference is layernorm or NormProp, never none or BatchNorm; it has ratio 1 to itself,
    and every ratio is the median of the round-by-round ratios of the steps it timed."""
    from normprop_cli.bench import timing as bench_timing

    timed, measured = ("none", "batchnorm", "layernorm", "normprop-icml"), []
    step_times = bench_timing.step_times

    def recorded(*args, **kwargs):  # the per-round step times the bench computed its ratios from
        measured.append(step_times(*args, **kwargs))
        return measured[-1]

    monkeypatch.setattr(bench_timing, "step_times", recorded)
    table = run_bench(batch_sizes=(1,), widths=(0.125,), steps=3, warmup=1, device="cpu", results_dir=tmp_path,
                      epochs=0, preset="smoke", quiet=True, precisions=("float32",), methods=timed)  # fmt: skip
    [(times, *_)] = measured
    rows = table.set_index("method")
    fastest = rows["fastest_independent"].unique().tolist()
    assert len(fastest) == 1 and fastest[0] in ("layernorm", "normprop-icml")
    assert rows.loc[fastest[0], "step_ms_median"] == rows.loc[["layernorm", "normprop-icml"], "step_ms_median"].min()
    assert rows.loc[fastest[0], "ratio_vs_fastest_independent"] == 1.0
    for m in timed:
        by_hand = statistics.median(a / b for a, b in zip(times[m], times[fastest[0]], strict=True))
        assert rows.loc[m, "ratio_vs_fastest_independent"] == pytest.approx(by_hand, rel=1e-12), m
    assert rows["ratio_vs_fastest_independent_low"].isna().all()  # 3 rounds: too few for a 95% interval
    on_disk = pd.read_csv(tmp_path / "bench" / "bench.csv")
    assert list(on_disk.columns) == COLUMNS and set(on_disk["fastest_independent"]) == set(fastest)


def conv_flops(model, x) -> float:
    """A NIN step's convolution FLOPs written out: 2 per multiply-add, forward, the weight gradient and
    the input gradient of every conv but the first (the images need no gradient)."""
    macs = []
    hooks = [m.register_forward_hook(lambda m, i, o: macs.append(o.numel() * m.weight[0].numel()))
             for m in model.modules() if isinstance(m, torch.nn.Conv2d)]  # fmt: skip
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return 2 * (3 * sum(macs) - macs[0])


def test_flops_are_the_convolutions_whatever_the_normalisation(bench):
    """gflop_per_step is the same for every method of a configuration, the NIN's conv arithmetic written
    out, and gflops is it over the median step time."""
    from normprop_cli import config
    from normprop_cli.bench.timing import _batches

    table, _ = bench
    cpu = torch.device("cpu")
    cfg = config.load("table1", preset="smoke")
    cfg.model.width = 0.0625
    data = bench_data(cfg, cpu)
    model = build_step(cfg, data, cpu, "none", StepOptions()).model
    for (batch, precision), group in table.groupby(["batch_size", "precision"]):
        x = _batches(data, cfg, cpu, int(batch), count=1)[0][0]
        expected = conv_flops(model, x) / 1e9
        assert group["gflop_per_step"].tolist() == pytest.approx([expected] * len(TIMED), rel=1e-12), precision
        rate = group["gflop_per_step"] / (group["step_ms_median"] / 1e3)
        assert group["gflops"].tolist() == pytest.approx(rate.tolist())


def test_every_configuration_times_at_least_the_least_steps(monkeypatch):
    """Whatever the budget and the number of methods: 100 timed steps at batch 1, 30 otherwise."""
    from normprop_cli import config
    from normprop_cli.bench import bench_data
    from normprop_cli.bench import timing as bench_timing

    cpu = torch.device("cpu")
    cfg = config.load("table1", preset="smoke")
    data = bench_data(cfg, cpu)
    monkeypatch.setitem(bench_timing.LEAST_STEPS, 1, 7)  # as many as 100, but fast
    monkeypatch.setattr(bench_timing, "LEAST_OTHERWISE", 4)
    for batch, least in ((1, 7), (2, 4)):
        times, *_ = bench_timing.step_times(data, cfg, cpu, 0.0625, batch, None, 1, 1e-9, StepOptions(),
                                              ("none", "batchnorm"))  # fmt: skip
        assert {len(t) for t in times.values()} == {least}


def test_finite_reads_every_steps_loss_though_a_graph_overwrites_its_output(monkeypatch):
    """A CUDA graph's step returns one output tensor at every replay: a loss that was not finite at one step
    and finite again at the last still makes `finite` False."""
    from normprop_cli import config
    from normprop_cli.bench import bench_data
    from normprop_cli.bench import timing as bench_timing

    class Replayed:
        clock = None

        def __init__(self):
            self.out, self.k = torch.zeros(()), 0

        def __call__(self, x, y):
            self.clock.start()
            self.k += 1
            self.out.fill_(math.nan if self.k == 2 else float(self.k))  # written in place, as a graph's output
            self.clock.stop()
            return self.out, self.out

    monkeypatch.setattr(bench_timing, "build_step", lambda *a, **k: Replayed())
    cpu = torch.device("cpu")
    cfg = config.load("table1", preset="smoke")
    _, _, finite, _ = bench_timing.step_times(bench_data(cfg, cpu), cfg, cpu, 0.0625, 2, 3, 1, 1.0, StepOptions(),
                                              ("none",), counted=False)  # fmt: skip
    assert finite == {"none": False}


def test_epoch_shares_add_up(bench):
    table, out = bench
    epochs = table.attrs["epochs"]
    assert list(epochs.columns) == EPOCH_COLUMNS and len(epochs) == 6
    assert sorted(epochs["precision"]) == ["bfloat16"] * 3 + ["float32"] * 3
    assert list(pd.read_csv(out / "bench" / "epochs.csv").columns) == EPOCH_COLUMNS
    for row in epochs.itertuples():
        assert 0 < row.steps_s <= row.train_s <= row.epoch_s
        assert 0 <= row.outside_share <= 1
        assert math.isclose(row.outside_share, row.data_share + row.eval_share, abs_tol=1e-9)


def test_denormals_are_flushed_on_the_cpu():
    from normprop_cli import device

    device.prepare(torch.device("cpu"))
    assert denormals_flushed(torch.device("cpu"))


def test_bf16_rows_where_native_and_one_line_why_not(monkeypatch, tmp_path, capsys):
    cpu = torch.device("cpu")
    monkeypatch.setattr(devices, "bf16_supported", lambda dev: (True, "CPU flags avx512_bf16"))
    assert choose_precisions(cpu) == (PRECISIONS, "")
    monkeypatch.setattr(devices, "bf16_supported", lambda dev: (False, "no bf16 flag"))
    assert choose_precisions(cpu, ["float32"]) == (("float32",), "")
    assert "emulated" in choose_precisions(cpu, ["bfloat16"])[1]
    with pytest.raises(ValueError, match="float16"):
        choose_precisions(cpu, ["float16"])
    table = run_bench(batch_sizes=(2,), widths=(0.0625,), steps=1, warmup=0, device="cpu",
                      results_dir=tmp_path, epochs=0, preset="smoke")  # fmt: skip
    assert set(table["precision"]) == {"float32"}
    lines = [line for line in capsys.readouterr().out.splitlines() if "bfloat16" in line]
    assert lines == ["bfloat16 left out: no bf16 flag (ask for it with --precision float32,bfloat16)"]


def test_bf16_support_is_read_from_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(devices, "_cpu_flags", lambda: frozenset({"avx512f", "amx_bf16"}))
    assert devices.bf16_supported(torch.device("cpu")) == (True, "CPU flags amx_bf16")
    monkeypatch.setattr(devices, "_cpu_flags", lambda: frozenset({"avx512f", "avx2"}))
    native, why = devices.bf16_supported(torch.device("cpu"))
    assert not native and "amx_bf16" in why and "avx512_bf16" in why
    monkeypatch.setattr(devices, "_cpu_flags", lambda: None)
    assert devices.bf16_supported(torch.device("cpu"))[0] is False


def test_an_unknown_precision_is_a_one_line_error(cli):
    result = cli("bench", "--precision", "float16", "--results-dir", cli.results)
    assert result.exit_code == 2 and "--precision" in result.output
    assert not cli.results.exists()


def test_every_method_steps_side_by_side(tmp_path):
    """The default bench: a row per METHODS name, its own model options, finite losses, both precisions."""
    table = run_bench(batch_sizes=(2,), widths=(0.0625,), steps=1, warmup=0, device="cpu", results_dir=tmp_path,
                      epochs=0, preset="smoke", quiet=True, precisions=PRECISIONS)  # fmt: skip
    for precision, group in table.groupby("precision"):
        assert list(group["method"]) == list(METHODS), precision
        assert group["finite"].all(), group.loc[~group["finite"], "method"].tolist()
    assert len(pd.read_csv(tmp_path / "bench" / "bench.csv")) == 2 * len(METHODS)


def test_a_method_steps_with_its_model_options():
    """norm and NormProp's jacobian from METHODS; the unit-norm constraint for NormProp alone."""
    from normprop_cli import config
    from normprop_cli.nn.layers import NormPropLayer

    cpu = torch.device("cpu")
    cfg = config.load("table1", preset="smoke")
    data = bench_data(cfg, cpu)
    for method in METHODS:
        options = model_options(method)
        step = build_step(cfg, data, cpu, method, StepOptions())
        assert step.model.norm == options["norm"] and step.constrain == (options["norm"] == "normprop"), method
        jacobians = {m.jacobian for m in step.model.modules() if isinstance(m, NormPropLayer)}
        assert jacobians == ({options["jacobian"]} if "jacobian" in options else set()), method
        assert step.optimizer.param_groups[0]["lr"] == (1e-4 if method == "none" else cfg.train.lr)
        clipped = "train.agc" in METHODS[method].settings  # scaled WS: NFNets' clipping
        assert (step.clip is not None) == clipped, method


def test_methods_pick_a_subset_and_ratios_need_their_reference(cli):
    tiny = ("--widths", "0.0625", "--batch-sizes", "2", "--budget", "0.01", "--epochs", "0", "--precision", "float32")
    result = cli("bench", "--methods", "normprop-arxiv, batchnorm", *tiny, "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(cli.results / "bench" / "bench.csv")
    assert list(table["method"]) == ["batchnorm", "normprop-arxiv"]
    assert table["ratio_vs_none"].isna().all()  # none was not timed
    assert (table["fastest_independent"] == "normprop-arxiv").all()  # the one batch-independent normaliser timed
    assert table.set_index("method").loc["batchnorm", "ratio_vs_batchnorm"] == 1.0
    assert choose_methods(None) == tuple(METHODS)


def test_an_unknown_method_is_a_one_line_error_and_writes_nothing(cli):
    result = cli("bench", "--methods", "none,groupnrom", "--results-dir", cli.results)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "groupnrom" in result.output and "normprop-icml" in result.output
    assert not cli.results.exists()
    with pytest.raises(ValueError, match="normprop'"):
        choose_methods(["normprop"])  # NormProp is named by its form: normprop-icml or normprop-arxiv
