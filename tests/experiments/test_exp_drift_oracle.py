"""The drift experiment's Sigma-oracle (nn/oracle.py, drift/oracle.py), its in-epoch probes (drift/steps.py)
and the learning-rate settings: the oracle layer under Proposition 1's premise failing, plain NormProp
untouched with the option off, the fashion grid's new settings, and a smoke run of the oracle setting."""

import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from normprop_cli import config
from normprop_cli.engine import expand_grid
from normprop_cli.engine.runs import sweep_dir
from normprop_cli.experiments import EXPERIMENTS, drift
from normprop_cli.experiments.drift.ablation import is_reference, kind_label, label, rate_scale, setting_kind
from normprop_cli.experiments.lr_sweep import with_rates
from normprop_cli.nn import NIN, NormPropConv2d
from normprop_cli.nn.oracle import SigmaOracleConv2d, patch_covariance


def correlated(n: int, gen: torch.Generator, rho: float = 0.8) -> torch.Tensor:
    """[n, 4, 12, 12] with every unit N(0, 1) but strongly correlated across channels (rho) and, by a blur,
    across neighbouring positions: a patch covariance far from sigma^2 I."""
    z = torch.randn(n, 5, 16, 16, generator=gen)
    mixed = math.sqrt(rho) * z[:, :1] + math.sqrt(1 - rho) * z[:, 1:]
    blur = torch.ones(4, 1, 5, 5) / 25.0
    x = F.conv2d(mixed, blur, groups=4)[:, :, :12, :12]
    return (x - x.mean()) / x.std()


def unit_moments(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each output unit's (channel's) mean and std over images and positions."""
    flat = y.transpose(0, 1).flatten(1)
    return flat.mean(1), flat.std(1)


def test_the_oracle_keeps_unit_pre_activations_where_plain_normprop_does_not():
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    plain = NormPropConv2d(4, 16, 3, activation=None)
    oracle = SigmaOracleConv2d(4, 16, 3, activation=None)
    with torch.no_grad():
        plain.weight[:4] = plain.weight[:4].abs()  # filters along the input's top direction, as trained ones go
        oracle.load_state_dict(plain.state_dict() | {"metric": oracle.metric, "input_var": oracle.input_var})
    fit, test = correlated(400, gen), correlated(400, gen)
    cov = patch_covariance(fit, oracle, torch.ones(12, 12, dtype=torch.bool), positions=1000, seed=0)
    top = torch.linalg.eigvalsh(cov)[-1] / torch.diagonal(cov).sum()
    assert top > 0.5  # Prop. 1's premise fails: white input would put 1/36 of the trace on each direction
    oracle.set_covariance(cov)
    with torch.no_grad():
        mean, std = unit_moments(oracle(test))
        plain_mean, plain_std = unit_moments(plain(test))
    assert (std - 1).abs().max() < 0.1 and mean.abs().max() < 0.1
    assert (plain_std - 1).abs().max() > 1.0 and plain_std[:4].min() > 2.0  # aligned filters: far above 1


def test_the_oracle_is_plain_normprop_before_its_first_refresh():
    torch.manual_seed(0)
    oracle = SigmaOracleConv2d(4, 8, 3, padding=1)
    plain = NormPropConv2d(4, 8, 3, padding=1)
    plain.load_state_dict({k: v for k, v in oracle.state_dict().items() if k not in ("metric", "input_var")})
    x = torch.randn(5, 4, 10, 10)
    assert torch.allclose(oracle(x), plain(x), atol=1e-5)


def _trained(model: NIN, steps: int = 3) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out = []
    model.train()
    for _ in range(steps):
        x, y = torch.randn(8, 1, 32, 32, generator=gen), torch.randint(10, (8,), generator=gen)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.detach())
    return out


def test_the_option_off_is_plain_normprop_bit_for_bit():
    torch.manual_seed(0)
    plain = NIN(10, 1, "normprop", 0.125)
    torch.manual_seed(0)
    off = NIN(10, 1, "normprop", 0.125, sigma_oracle_every=0)
    assert list(off.state_dict()) == list(plain.state_dict())  # no buffer, no extra state: old checkpoints load
    assert not hasattr(off, "sigma_oracle") and len(off._folded) == len(plain._folded) == 9
    assert all(type(m) is NormPropConv2d for m in off.hidden_layers())
    losses = _trained(off), _trained(plain)
    assert all(torch.equal(a, b) for a, b in zip(*losses, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(off.state_dict().values(), plain.state_dict().values(), strict=True))


def test_the_oracle_refreshes_every_n_steps_and_resumes_from_its_state():
    torch.manual_seed(0)
    model = NIN(10, 1, "normprop", 0.125, sigma_oracle_every=2)
    with pytest.raises(RuntimeError, match="held-out batch"):
        _trained(model, 1)
    model.sigma_oracle.steps = 0
    model.sigma_oracle.give(model, torch.randn(40, 1, 32, 32, generator=torch.Generator().manual_seed(2)))
    layer = model.features.conv4
    first = layer.metric.clone()
    assert not torch.equal(first, torch.eye(len(first))) and math.isfinite(float(layer.input_var))
    _trained(model, 2)  # steps 0 and 1: no refresh before step 2
    assert model.sigma_oracle.steps == 2 and torch.equal(layer.metric, first)
    _trained(model, 1)  # step 2 refreshes from the moved weights
    assert not torch.equal(layer.metric, first)
    resumed = NIN(10, 1, "normprop", 0.125, sigma_oracle_every=2)
    resumed.load_state_dict(model.state_dict())
    assert resumed.sigma_oracle.steps == 3 and torch.equal(resumed.sigma_oracle.held_out, model.sigma_oracle.held_out)
    assert torch.equal(resumed.features.conv4.metric, layer.metric)


def test_only_normprop_takes_the_oracle():
    with pytest.raises(ValueError, match="sigma_oracle_every"):
        NIN(10, 1, "batchnorm", 0.125, sigma_oracle_every=50)


def test_the_fashion_grid_adds_the_oracle_and_the_rates():
    cfg = config.load("drift", preset="fashion")
    entries = {e.id: e for e in cfg.grid}
    new = ["normprop-sigma-oracle", "normprop-steps", "normprop-half-rate", "normprop-double-rate",
           "normprop-sigma-oracle-frozen-affine"]  # fmt: skip
    ids = [e.id for e in cfg.grid]
    first = ids.index(new[0])
    assert ids[first : first + 5] == new
    assert entries["normprop-sigma-oracle"].set["model.sigma_oracle_every"] == 50
    assert not entries["normprop-sigma-oracle"].get("rate_of")  # swept at its own rate
    assert all(entries[k].rate_of == "normprop" for k in new[1:4])
    assert entries[new[4]].rate_of == "normprop-sigma-oracle" and entries[new[4]].set["model.freeze_affine"] is True
    assert all(entries[k].set["experiment.probe_every_steps"] == 50 for k in new)
    assert all("experiment.probe_every_steps" not in e.set for e in cfg.grid[:first])  # the committed runs' configs
    assert {e.id for e in cfg.grid} >= {"normprop", "batchnorm", "normprop-zca"}
    specs = expand_grid(cfg)
    assert len(specs) == 47 and {s.cfg.model.sigma_oracle_every for s in specs} == {0, 50}
    sweep = pd.DataFrame({"setting": ["normprop", "normprop-sigma-oracle"], "lr": [0.05, 0.1], "chosen": [True] * 2})
    sweep = pd.concat([sweep, pd.DataFrame({"setting": [e.id for e in cfg.grid if not e.get("rate_of")
                                                        and e.id not in ("normprop", "normprop-sigma-oracle")],
                                            "lr": 0.02, "chosen": True})])  # fmt: skip
    rates = {e.id: e.set["train.lr"] for e in with_rates(cfg, sweep).grid}
    assert (rates["normprop-half-rate"], rates["normprop"], rates["normprop-double-rate"]) == (0.025, 0.05, 0.1)
    assert rates["normprop-steps"] == 0.05 and rates["normprop-sigma-oracle"] == 0.1
    assert rates["normprop-sigma-oracle-frozen-affine"] == 0.1
    assert rate_scale(cfg, "normprop-half-rate") == 0.5 and rate_scale(cfg, "normprop") is None
    assert label(cfg, "normprop-half-rate", "normprop") == "NormProp at half its swept rate"
    assert is_reference(cfg, "normprop-steps") and not is_reference(cfg, "normprop-sigma-oracle")
    assert label(cfg, "normprop-steps", "normprop") == "NormProp (in-epoch probes)"
    get = lambda given: lambda key: given.get(key)  # noqa: E731
    kind = setting_kind(get({"model.norm": "normprop", "model.sigma_oracle_every": 50}))
    assert kind == "normprop-sigma-oracle" and "Sigma-oracle" in kind_label(kind)
    both = setting_kind(get({"model.norm": "normprop", "model.sigma_oracle_every": 50, "model.freeze_affine": True}))
    assert kind_label(both) == "NormProp with gamma and beta frozen, with the Sigma-oracle divisor"


def test_a_smoke_run_of_the_oracle_writes_its_rows(tmp_path):
    cfg = config.load("drift", preset="smoke", results_dir=str(tmp_path), quiet=True)
    cfg.seeds, cfg.train.epochs = 2, 1
    cfg.experiment.lr_sweep = {"step": 2.0, "points": 1, "extend": 0, "seeds": [100, 101], "epochs": 1}
    probes, lr = {"experiment.probe_every_steps": 1}, {"train.lr": 0.02}
    cfg.grid = [{"id": "normprop", "set": {"model.norm": "normprop"} | lr},
                {"id": "normprop-sigma-oracle", "set": {"model.norm": "normprop", "model.sigma_oracle_every": 1}
                 | probes | lr},
                {"id": "normprop-steps", "rate_of": "normprop", "set": {"model.norm": "normprop"} | probes | lr},
                {"id": "normprop-half-rate", "rate_of": "normprop", "rate_scale": 0.5,
                 "set": {"model.norm": "normprop"} | lr},
                {"id": "batchnorm", "set": {"model.norm": "batchnorm"} | lr}]  # fmt: skip
    EXPERIMENTS["drift"].run(cfg)
    out = sweep_dir(cfg)
    oracle = pd.read_csv(out / "sigma_oracle.csv")
    assert set(oracle["setting"]) == {"normprop-sigma-oracle"} and sorted(oracle["epoch"].unique()) == [0, 1]
    assert oracle["divisor_ratio"].gt(0).all() and oracle["input_var"].gt(0).all()
    steps = pd.read_csv(out / "spread_steps.csv")
    assert set(steps["setting"]) == {"normprop-sigma-oracle", "normprop-steps"}
    assert steps["epoch"].between(0, 1, inclusive="left").all() and steps["step"].max() >= 1
    assert len(pd.read_csv(out / "population_steps.csv"))
    ablation = pd.read_csv(out / "ablation.csv").set_index("setting")
    assert {"normprop-sigma-oracle", "normprop-steps", "normprop-half-rate"} <= set(ablation.index)
    assert ablation.loc["normprop-half-rate", "lr"] == pytest.approx(ablation.loc["normprop", "lr"] / 2)
    summary = pd.read_csv(out / "summary.csv")  # random labels learn nothing: read the text as if they had
    summary.assign(learned=True).to_csv(out / "summary.csv", index=False)
    texts = drift.paragraphs(cfg)
    assert any(t.startswith("**Sigma-oracle.**") for t in texts)
    assert any(t.startswith("**The learning rate.**") for t in texts)
    assert any(t.startswith("**Inside epoch 1.**") for t in texts)
    assert not any("normprop-steps" in t for t in texts if t.startswith("NormProp (in-epoch probes) ("))
