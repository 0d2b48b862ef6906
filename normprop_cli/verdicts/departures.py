"""Where a run departs from the paper's protocol, in plain sentences for the report: the data set, its
input, epochs, schedule, width, subsets, probes, seeds and augmentation."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from normprop_cli import verdicts
from normprop_cli.engine.runs import CONFIG
from normprop_cli.verdicts import paper_datasets

INPUTS = {  # how a data set's images enter the NIN, where that is not the paper's 3x32x32
    "fashion-mnist": "Input: Fashion-MNIST's 28x28 grey images, zero-padded by 2 pixels to 32x32 (the background "
    "is 0), one input channel; `train.augment` applies random horizontal flips, as the paper's CIFAR protocol does.",
    "digits": "Input: scikit-learn's 8x8 digits, resized to 32x32 and copied into three channels.",
}


def departures(experiment: str, prov: dict, directory: Path | None = None) -> list[str]:
    """Plain sentences wherever a run departs from the paper's protocol."""
    if not prov:
        return []
    cfg, out = prov["cfg"], []
    paper_sets = paper_datasets(experiment)
    dataset = cfg.dataset.name
    if dataset not in paper_sets:
        out.append(
            f"Data set: {dataset}, not the paper's {' / '.join(paper_sets)}; the numbers are not "
            "comparable with the paper's, only the trends are."
        )
    paper = verdicts.paper_protocol(experiment, dataset)
    if cfg.train.epochs != paper.train.epochs:
        out.append(f"Epochs: {cfg.train.epochs} per run, the paper's protocol has {paper.train.epochs}.")
    if cfg.train.lr_halve_every != paper.train.lr_halve_every:
        out.append(
            f"The learning rate is halved every {cfg.train.lr_halve_every} epochs, the paper's protocol "
            f"every {paper.train.lr_halve_every}."
        )
    if cfg.model.width != 1.0:
        out.append(f"Width: the NIN's hidden widths are scaled by {cfg.model.width} (the paper: 1.0).")
    if cfg.dataset.get("limit"):
        out.append(f"Only {cfg.dataset.limit} examples per split were used.")
    if cfg.dataset.get("train_limit"):
        out.append(
            f"Training images: a seeded subset of {cfg.dataset.train_limit:,} of the training split "
            "(validation and test whole)."
        )
    if dataset in INPUTS:
        out.append(INPUTS[dataset])
    if cfg.train.get("probe_images"):
        out.append(
            f"Probes: the hidden layers' inputs are measured on the first {cfg.train.probe_images:,} test images, "
            "not all of them."
        )
    if prov["seeds"] < int(paper.seeds):
        out.append(f"Seeds: {prov['seeds']}, the paper preset uses {paper.seeds}.")
    if directory is not None and augments(directory):
        out += augmentation(dataset, cfg.dataset.get("augment"))
    return out


def augments(directory: Path) -> bool:
    """Did any run of the sweep train with augmentation (train.augment)?"""
    return any(
        OmegaConf.select(OmegaConf.load(path), "train.augment", default=False)
        for path in sorted((directory / "runs").glob(f"*/{CONFIG}"))
    )


def augmentation(dataset: str, mode: str | None) -> list[str]:
    """The paper flips CIFAR images (section 5.5); what the runs did instead, if not that."""
    if mode is None or mode == "flip" or dataset in ("cifar10", "cifar100"):
        return []
    if mode == "translate":
        why = " (digits are not mirror-symmetric)" if dataset == "digits" else ""
        return [f"Augmentation: small random translations, not the paper's horizontal flips{why}."]
    return [f"Augmentation: {mode}, not the paper's horizontal flips."]
