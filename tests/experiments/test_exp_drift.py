"""Beyond the paper (drift): Prop. 1's premise at every conv layer's input over training."""

import itertools
import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from normprop_cli import config, io
from normprop_cli.experiments import drift
from normprop_cli.experiments.drift import (
    SPREAD_COLUMNS,
    MapMoments,
    SpreadProbe,
    coherence,
    full_patches,
    random_coherence,
    spectrum,
)
from normprop_cli.experiments.probes import POPULATION_COLUMNS

RUN = ["run", "setting", "method", "seed", "width"]


@pytest.fixture(scope="module")
def results(run_experiment):
    return run_experiment("drift", "--preset", "smoke", "--quiet")


@pytest.fixture(scope="module")
def sweep(results):
    return results / "drift" / "synthetic"


def test_smoke_run_writes_spread_and_population_for_both_methods_and_the_wide_run(sweep):
    spread = pd.read_csv(sweep / "spread.csv")
    assert list(spread.columns) == RUN + SPREAD_COLUMNS
    settings = spread.groupby("setting")[["method", "width"]].first()
    assert settings.loc["normprop"].tolist() == ["normprop", 0.0625]
    assert settings.loc["batchnorm"].tolist() == ["batchnorm", 0.0625]
    assert settings.loc["wide"].tolist() == ["normprop", 0.125]
    for _, g in spread.groupby("run"):
        assert sorted(g["layer"].unique()) == list(range(1, 10)) and sorted(g["epoch"].unique()) == [0, 1, 2]
    assert np.allclose(spread["ratio"], spread["proj_std"] / spread["input_std"])
    assert (spread["patch_samples"] > 0).all() and spread["input_top_eig_fraction"].between(0, 1).all()
    population = pd.read_csv(sweep / "population.csv")
    assert list(population.columns)[: len(RUN) + len(POPULATION_COLUMNS)] == RUN + POPULATION_COLUMNS
    assert set(population["setting"]) == {"normprop", "batchnorm", "wide"}
    assert sorted(population["layer"].unique()) == list(range(2, 10))
    summary = pd.read_csv(sweep / "summary.csv")
    assert len(summary) == 3
    assert {"width", "final_mean_ratio", "final_population_drift", "final_population_abs_mean"} <= set(summary)


def test_smoke_run_has_no_sweep_no_affine_probe_and_no_ablation(sweep):
    for name in ("lr_sweep.csv", "affine.csv", "ablation.csv", "drift_ablation.png"):
        assert not (sweep / name).exists()
    assert not any((run / "affine.csv").exists() for run in (sweep / "runs").iterdir())
    assert not {"final_gamma_change", "final_beta_change"} & set(pd.read_csv(sweep / "summary.csv"))


def test_plot_redraws_from_the_csvs_alone(assert_redraws, results):
    assert_redraws("drift", results)


def test_headlines_and_findings_read_the_csvs(results):
    cfg = config.load("drift", preset="smoke", results_dir=str(results))
    rows = drift.headlines(cfg)
    assert rows and all({"quantity", "reproduced", "paper"} <= set(r) for r in rows)
    assert all(isinstance(p, str) and p for p in drift.paragraphs(cfg))


class OneConv(nn.Module):
    """The smallest model the probes read: `features` in order and `hidden_layers()`."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.features = nn.Sequential(OrderedDict(conv1=conv))

    def hidden_layers(self):
        return [self.features.conv1]

    def forward(self, x):
        return self.features(x)


def spread_row(x: torch.Tensor, weight: torch.Tensor, padding: int = 1) -> dict:
    conv = nn.Conv2d(weight.shape[1], weight.shape[0], weight.shape[-1], padding=padding, bias=False)
    with torch.no_grad():
        conv.weight.copy_(weight)
    batches = lambda: ((part, None) for part in x.split(500))  # noqa: E731
    (row,) = SpreadProbe(positions=4, images=512).observe(OneConv(conv), batches, epoch=0)
    return row


def test_ratio_is_one_for_white_input_and_orthonormal_filters():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 8, 6, 6, generator=gen)  # E[xx^T] = I
    n = 8 * 3 * 3
    q, _ = torch.linalg.qr(torch.randn(n, 16, generator=gen, dtype=torch.float64))
    row = spread_row(x, q.T.float().reshape(16, 8, 3, 3))  # 16 orthonormal rows
    assert row["input_std"] == pytest.approx(1.0, abs=0.02)
    assert row["ratio"] == pytest.approx(1.0, abs=0.03)  # var(W_i x) = ||W_i||^2 sigma^2 = 1
    assert row["coherence_max"] < 1e-6 and row["coherence_mean"] < 1e-6  # orthogonal rows: mu = 0
    assert row["patch_dim"] == n and row["patch_samples"] == 512 * 4
    assert row["input_top_eig_fraction"] < 2.5 / n  # white: 1/n, plus the sampling error of 2048 patches
    assert row["input_effective_rank"] > 0.9 * n


def test_ratio_grows_when_the_filter_lines_up_with_a_correlated_input():
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(3000, 1, 1, 1, generator=gen)
    x = z + 0.1 * torch.randn(3000, 8, 6, 6, generator=gen)  # every unit carries the same z: far from I
    n = 8 * 3 * 3
    aligned = torch.ones(1, 8, 3, 3)  # the top eigenvector of the patch covariance, ones / sqrt(n)
    row = spread_row(x, aligned)
    # var(W x / ||W||) = n var(z) + 0.01 against var(x_j) = 1.01 per unit
    assert row["ratio"] == pytest.approx(math.sqrt((n + 0.01) / 1.01), rel=0.05)
    assert row["ratio"] > 8
    assert row["input_top_eig_fraction"] == pytest.approx(n / (n + 0.01 * n), rel=0.02)
    white = spread_row(torch.randn(3000, 8, 6, 6, generator=gen), aligned)
    assert white["ratio"] == pytest.approx(1.0, abs=0.05)  # the same filter on white input: 1


def test_coherence_of_a_hand_built_matrix():
    w = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 1.0, 0.0], [0.0, 2.0, 2.0]]).reshape(3, 3, 1, 1)
    # |cos| of the pairs: (1,2) 1/sqrt(2), (1,3) 0, (2,3) 1/2
    mu, mean = coherence(w)
    assert mu == pytest.approx(1 / math.sqrt(2))
    assert mean == pytest.approx((1 / math.sqrt(2) + 0.0 + 0.5) / 3)
    assert math.isnan(coherence(torch.ones(1, 3, 1, 1))[0])  # one row has no pair


def test_random_coherence_is_the_closed_form_mean_abs_cosine():
    assert random_coherence(2) == pytest.approx(2 / math.pi)  # |cos| of a uniform angle
    assert random_coherence(3) == pytest.approx(0.5)  # uniform on [-1, 1]
    assert random_coherence(10_000) == pytest.approx(math.sqrt(2 / (math.pi * 10_000)), rel=1e-3)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 20_000, 50, generator=gen, dtype=torch.float64)
    sampled = (torch.nn.functional.cosine_similarity(a, b, dim=1).abs().mean()).item()
    assert sampled == pytest.approx(random_coherence(50), rel=0.02)


def test_map_moments_match_torch_in_either_memory_format():
    x = 3.0 + torch.randn(50, 4, 5, 5, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[0] = False
    expected = x.double().var(0, correction=0)[:, mask].mean().sqrt().item()
    for v in (x, x.contiguous(memory_format=torch.channels_last)):
        m = MapMoments()
        for part in v.split(16):
            m.add(part)
        assert m.n == 50 and m.rms_std(mask) == pytest.approx(expected, rel=1e-9)


def test_spectrum_matches_the_eigenvalues_of_the_sample_covariance():
    gen = torch.Generator().manual_seed(3)
    for samples in (20, 200):  # fewer and more samples than dimensions
        x = torch.randn(samples, 40, generator=gen, dtype=torch.float64) * torch.linspace(0.1, 3.0, 40)
        eig = torch.linalg.eigvalsh(torch.cov(x.T, correction=0))
        top, rank = spectrum(x)
        assert top == pytest.approx((eig[-1] / eig.sum()).item())
        assert rank == pytest.approx((eig.sum() ** 2 / eig.square().sum()).item())


def test_full_patches_leave_out_padding_and_the_constant_border():
    assert full_patches(torch.ones(6, 6, dtype=torch.bool), (3, 3), (1, 1), (1, 1)).sum() == 16  # 4 x 4 inside
    # NIN's conv 8, C(192,1,1,2) on a 4x4 map: only the middle 4x4 of its 8x8 output sees the image
    out = full_patches(torch.ones(4, 4, dtype=torch.bool), (1, 1), (1, 1), (2, 2))
    assert out.shape == (8, 8) and out[2:6, 2:6].all() and out.sum() == 16
    # conv 9 reads that 8x8 map: its border is constant, so no output there is compared
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[2:6, 2:6] = True
    assert torch.equal(full_patches(mask, (1, 1), (1, 1), (0, 0)), mask)


SPREAD = {"input_std": 1.0, "coherence_max": 0.3, "coherence_mean": 0.05, "coherence_random": 0.04,
          "input_top_eig_fraction": 0.4, "input_effective_rank": 3.0, "patch_dim": 600,
          "patch_samples": 1200}  # fmt: skip


def fabricated(tmp_path, ratio_final: float, abs_mean_np: float) -> DictConfig:
    """A drift sweep's CSVs with chosen numbers, no training: NormProp and BN at width 0.25, 2 seeds;
    only NormProp's final ratio and average |mean| move (BN: ratio 1, |mean| 0.52, drift 1)."""
    cfg = config.load("drift", preset="quick", results_dir=str(tmp_path))
    spread, population, summary = [], [], []
    for method in ("normprop", "batchnorm"):
        for seed in (0, 1):
            head = {"run": f"{method}-s{seed}", "setting": method, "method": method, "seed": seed, "width": 0.25}
            summary.append({"run": head["run"], "learned": True})
            for epoch, layer in itertools.product((0, 4), range(1, 10)):
                trained = epoch > 0 and method == "normprop"
                ratio = ratio_final if trained else 1.0
                spread.append(head | {"layer": layer, "epoch": epoch, "proj_std": ratio, "ratio": ratio} | SPREAD)
                if layer == 1:
                    continue
                abs_mean = 0.1 if epoch == 0 else abs_mean_np if trained else 0.52
                population.append(
                    head
                    | {"layer": layer, "epoch": epoch, "units": 100, "avg_abs_mean": abs_mean, "avg_std": 2.0}
                    | {"avg_drift": 3.0 if trained else float(epoch > 0), "units_constant_at_init": 0}
                )
    for name, rows in (("spread", spread), ("population", population), ("summary", summary)):
        io.write_csv(tmp_path / "drift" / "digits" / f"{name}.csv", pd.DataFrame(rows))
    return cfg


def test_findings_cite_the_measured_numbers_whichever_way_they_come_out(tmp_path):
    text = " ".join(drift.paragraphs(fabricated(tmp_path / "a", ratio_final=3.21, abs_mean_np=1.87)))
    assert "3.21" in text and "1.87" in text and "0.52" in text
    assert "contradicts claim C2" in text and "the premise fails" in text
    text = " ".join(drift.paragraphs(fabricated(tmp_path / "b", ratio_final=1.04, abs_mean_np=0.2)))
    assert "1.04" in text and "supports claim C2" not in text  # drift 3.0 > 1.0: not closer on both
    assert "the premise fails" not in text and "do not show" in text


def with_run_configs(cfg: DictConfig, experiment: str, decays: dict) -> None:
    """runs/<run>/config.yaml for {run: train.decay} under `experiment`'s sweep beside cfg's, no training."""
    for run, decay in decays.items():
        train = {"weight_decay": 0.0005} | ({"decay": decay} if decay is not None else {})
        io.write_text(Path(cfg.results_dir) / experiment / cfg.dataset.name / "runs" / run / "config.yaml",
                      OmegaConf.to_yaml({"train": train}))  # fmt: skip


def test_the_report_says_which_parameters_the_runs_decay_read_from_their_configs(tmp_path):
    """The decay comes from the reported runs' config.yaml (not the sweep's), against the normalizers
    experiment's runs, with the reason: the paper's experiments (covariate-shift) decay every parameter."""
    from normprop_cli.experiments.drift.findings import decay_finding

    cfg = fabricated(tmp_path / "a", ratio_final=3.21, abs_mean_np=1.87)
    assert decay_finding(cfg) == ""  # no run's config.yaml: nothing to say
    runs = {f"{m}-s{s}": "all" for m in ("normprop", "batchnorm") for s in (0, 1)}
    with_run_configs(cfg, "drift", runs | {"sweep-normprop-lr0.1-s100": "weights"})
    assert "normalizers experiment's runs use `train.decay: weights`" in decay_finding(cfg)  # its config's
    with_run_configs(cfg, "normalizers", {"normprop-icml-b1-s0": "weights", "groupnorm-b1-s0": "weights"})
    text = decay_finding(cfg)
    assert text.count(". ") == 0 and text.startswith("*Weight decay.* The 4 runs here use `train.decay: all`")
    assert "while the normalizers experiment's runs use `train.decay: weights` (the kernels alone" in text
    assert "(covariate-shift), which weight-decay every parameter, so it trains them the same way." in text
    assert text in drift.paragraphs(cfg)
    with_run_configs(cfg, "drift", {"normprop-s0": None} | {"batchnorm-s0": "weights"})  # None: before decay existed
    text = decay_finding(cfg)
    assert "`train.decay: all` (every parameter, gains and biases included; weight decay 0.0005) in 3 runs" in text
    assert "`train.decay: weights` (the kernels alone; weight decay 0.0005) in 1 run" in text
    assert text.endswith("though not every run here does.")


def test_the_findings_state_their_facts_and_name_the_claim_from_claims_yaml(tmp_path):
    """Every number of the findings comes from findings_facts, and the claim the population measure bears
    on is conf/claims.yaml's claim of the covariate-shift experiment, whose protocol this one repeats."""
    from normprop_cli import prose
    from normprop_cli.experiments.drift.findings import findings_facts
    from normprop_cli.verdicts import claims

    facts = findings_facts(fabricated(tmp_path, ratio_final=3.21, abs_mean_np=1.87))
    claim = next(c for c in claims() if c.experiment == "covariate-shift")
    assert (facts["claim_id"], facts["claim"], facts["reading"]) == (claim.id, claim.claim, "further")
    text = " ".join(prose.render("drift_findings", facts))
    assert f"contradicts claim {claim.id} ({claim.claim}) on this measure" in text
    facts["claim_id"] = "C0"
    facts["normprop"] = facts["normprop"] | {"avg_std": 4.56, "ceiling": 7.89, "lined_up": False}
    text = " ".join(prose.render("drift_findings", facts))
    assert "contradicts claim C0 (" in text and "an average std of 4.56" in text and "= 7.9 times" in text
    assert "the premise fails" not in text and f"within {facts['premise']:g} of the premise's 1" in text
    assert facts["normprop"]["correlated"]  # SPREAD's top share 0.4 against white input's 1/600
    assert "so the input is far from sigma^2 I from the start" in text


def test_the_input_is_said_far_from_white_only_where_its_top_eigenvector_holds_more_than_twice_whites_share(tmp_path):
    from normprop_cli import prose
    from normprop_cli.experiments.drift.findings import findings_facts

    SPREAD["input_top_eig_fraction"] = 1.5 / 600  # 1.5 times white input's share of the trace (patch_dim 600)
    try:
        facts = findings_facts(fabricated(tmp_path, ratio_final=3.21, abs_mean_np=1.87))
    finally:
        SPREAD["input_top_eig_fraction"] = 0.4
    text = " ".join(prose.render("drift_findings", facts))
    assert not facts["normprop"]["correlated"]
    assert "so the input starts near sigma^2 I." in text and "far from sigma^2 I" not in text
