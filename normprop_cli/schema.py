"""The config's schema: which keys each part of conf/ may carry and the type of each, as OmegaConf checks them.

The YAML files under conf/ give every value; a schema gives none (each field is MISSING), so a key that no
YAML gives for a composition stays absent (dataset.translate_pixels on CIFAR, model.renorm.warmup_epochs
outside normalizers). `config` merges Hydra's composition into `Config`: an unknown key
(`+train.epoch=3`), or a value that does not fit its type (`train.lr=fast`, `train.epochs=2.5`), is
OmegaConf's error, which `config` words as one line. What a type cannot say (a positive rate, a known
norm) is checked once per run, in `engine.job.validate`.

A new config key needs its field here beside its value in YAML, but for an experiment's own keys under
`experiment:`, which that node takes untyped (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

# OmegaConf 2.3 has no unions of value types: a key that takes true, false or a word (auto), or a number
# or a word (half), is Any, and engine.job.validate or its reader checks it.


class Figure(Enum):
    """A format a figure is saved in (`figures`)."""

    png = "png"
    pdf = "pdf"
    svg = "svg"


@dataclass
class Train:
    epochs: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    lr_halve_every: int = MISSING
    momentum: float = MISSING
    weight_decay: float = MISSING
    decay: str = MISSING
    agc: float | None = MISSING
    eval_test: bool = MISSING
    data_norm: str = MISSING
    augment: bool = MISSING
    max_steps: int | None = MISSING
    eval_batch_size: int = MISSING
    probe_images: int | None = MISSING
    channels_last: Any = MISSING  # true | false | auto
    amp: bool = MISSING
    compile: bool = MISSING
    cuda_graph: Any = MISSING  # true | false | auto


@dataclass
class Dataset:
    name: str = MISSING
    split_seed: int = MISSING
    limit: int | None = MISSING
    train_limit: int | None = MISSING
    num_classes: int = MISSING
    augment: str = MISSING
    translate_pixels: int = MISSING  # the data sets whose augmentation is translate


@dataclass
class Renorm:
    rmax: float = MISSING
    dmax: float = MISSING
    warmup_steps: int | None = MISSING
    rmax_steps: int | None = MISSING
    dmax_steps: int | None = MISSING
    warmup_epochs: float | None = MISSING  # the schedule in epochs (the normalizers experiment)
    rmax_epochs: float | None = MISSING
    dmax_epochs: float | None = MISSING


@dataclass
class Model:
    arch: str = MISSING
    norm: str = MISSING
    width: float = MISSING
    activation: str = MISSING
    jacobian: str = MISSING
    renorm: Renorm = MISSING
    classifier: str = MISSING
    freeze_affine: bool = MISSING
    data_init: bool = MISSING
    sigma_oracle_every: int = MISSING
    mean_oracle_every: int = MISSING
    center: bool = MISSING


@dataclass
class Launcher:
    name: str = MISSING
    timeout_min: int = MISSING  # local, slurm
    partition: str | None = MISSING  # slurm's, from here on
    account: str | None = MISSING
    qos: str | None = MISSING
    gpus_per_task: int = MISSING
    cpus_per_task: int = MISSING
    mem_gb: int | None = MISSING
    array_parallelism: int = MISSING
    max_requeues: int = MISSING
    setup: list[str] = MISSING
    additional: dict[str, Any] = MISSING


@dataclass
class LrSweep:
    factors: list[float] | None = MISSING  # the factors policy
    epochs: Any = MISSING  # a number of epochs, or half (each setting's own)
    step: float = MISSING  # the steps policy
    points: int = MISSING
    extend: int = MISSING
    seeds: list[int] = MISSING


@dataclass
class Experiment:
    """The protocol keys of the package's experiments, typed; each experiment's YAML gives its own. The node
    is open: a new experiment's keys need no field here (their overrides go unchecked until they have one)."""

    name: str = MISSING
    paper: str = MISSING
    paper_claim: str = MISSING
    # The paper's numbers and text, for the report (nested as each table has them).
    published: dict[str, Any] | None = MISSING
    paper_test_error: dict[str, Any] | None = MISSING
    paper_avg_abs_final_mean: dict[str, Any] | None = MISSING
    paper_settled: dict[str, Any] | None = MISSING
    paper_best_test_acc: float | None = MISSING
    paper_best_setting: dict[str, Any] | None = MISSING
    paper_expects: dict[str, Any] | None = MISSING
    paper_seconds: dict[str, Any] | None = MISSING
    paper_device: str | None = MISSING
    lr_sweep: LrSweep | None = MISSING  # batch-size, normalizers, drift (fashion, paper)
    early_epochs: int = MISSING  # convergence
    band: float = MISSING  # covariate-shift
    probe_draws: int = MISSING
    patch_positions: int = MISSING  # drift
    patch_images: int = MISSING
    affine_probe: bool = MISSING
    probe_every_steps: int = MISSING
    spread_probe: bool = MISSING
    moments_probe: bool = MISSING
    methods: list[str] = MISSING  # normalizers
    batch_sizes: list[int] = MISSING
    lr: list[float] = MISSING
    epochs: list[int] | None = MISSING
    lr_halve_every: list[int] | None = MISSING
    lr_scale: dict[str, float] | None = MISSING
    mode_gap_every: int = MISSING
    population_every: int = MISSING
    reference: str = MISSING
    extra_seeds: dict[str, int] | None = MISSING
    warmup_epochs: int = MISSING  # timing


@dataclass
class Theory:
    """The theory experiment's measurements (conf/experiment/theory.yaml)."""

    samples: int = MISSING
    mc_batches: int = MISSING
    prelu_slopes: list[float] = MISSING
    pool_sizes: list[int] = MISSING
    dropout_keep: list[float] = MISSING
    jacobian_width: int = MISSING
    jacobian_inputs: int = MISSING
    jacobian_activations: list[str] = MISSING
    jacobian_modes: list[str] = MISSING
    histogram_bins: int = MISSING
    prop1_m: int = MISSING
    prop1_small_m: int = MISSING
    prop1_n: int = MISSING
    prop1_sigma: float = MISSING
    prop1_row_norms: list[Any] = MISSING  # norms, or random
    prop1_rhos: list[float] = MISSING
    prop1_samples: int = MISSING
    depth: int = MISSING
    width: int = MISSING
    batch: int = MISSING
    propagation_jacobian: list[str] = MISSING
    propagation_seeds: int = MISSING
    nin_width: float = MISSING
    nin_batch: int = MISSING
    band: float = MISSING


@dataclass
class Preset:
    name: str = MISSING
    experiments: list[str] = MISSING  # what reproduce-all runs, where not every experiment


@dataclass
class Config:
    """conf/config.yaml with its groups: the root's keys, then one field per group."""

    seed: int = MISSING
    seeds: int = MISSING
    device: str = MISSING
    deterministic: bool = MISSING
    data_dir: str = MISSING
    results_dir: str = MISSING
    download: bool = MISSING
    quiet: bool = MISSING
    jobs: int = MISSING
    method: str | None = MISSING
    figures: list[Figure] = MISSING
    train: Train = MISSING
    dataset: Dataset = MISSING
    model: Model = MISSING
    launcher: Launcher = MISSING
    experiment: Experiment = field(default_factory=Experiment)  # a node, to be opened (`checked`)
    theory: Theory = MISSING
    grid: list[Any] | None = MISSING  # settings {id, set: {dotted key: value}, ...}: engine.expand_grid reads them
    preset: Preset = MISSING


def checked(cfg: DictConfig) -> DictConfig:
    """`cfg` merged into `Config`: OmegaConf raises on a key the schema lacks and on a value its type
    refuses (ValidationError). Returned plain (no schema attached, struct off, as the program extends it
    with keys of its own, e.g. a grid built in Python): the keys of `cfg` in its order, each value as its
    type has it (true for a boolean given as yes)."""
    typed = OmegaConf.to_container(OmegaConf.merge(_schema(), cfg), enum_to_str=True)
    return OmegaConf.create(_like(typed, OmegaConf.to_container(cfg)))


@cache
def _schema() -> DictConfig:
    """`Config` as OmegaConf's node, made once (a merge leaves its first argument as it is)."""
    schema = OmegaConf.structured(Config)
    OmegaConf.set_struct(schema.experiment, False)  # an experiment's own keys beside the typed ones
    return schema


def _like(values: dict, keys: dict) -> dict:
    """`values` with the keys of `keys`, in their order (the schema's order is not every YAML's)."""
    return {k: _like(values[k], v) if isinstance(v, dict) and isinstance(values[k], dict) else values[k]
            for k, v in keys.items()}  # fmt: skip
