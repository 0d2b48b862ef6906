"""Where a run departs from the paper's protocol: in plain sentences for the report (`departures`: the
data set, its input, epochs, schedule, width, subsets, probes, seeds and augmentation), and in a few
words for a verdict's note (`protocol_note`: the data set, epochs and width), from one list."""

from __future__ import annotations

from pathlib import Path

from normprop_cli.engine.runs import CONFIG
from normprop_cli.io import read_yaml
from normprop_cli.verdicts.sources import epochs_text, paper_datasets, paper_protocol

INPUTS = {  # how a data set's images enter the NIN, where that is not the paper's 3x32x32
    "fashion-mnist": "Input: Fashion-MNIST's 28x28 grey images, zero-padded by 2 pixels to 32x32 (the background "
    "is 0), one input channel; `train.augment` applies random horizontal flips, as the paper's CIFAR protocol does.",
    "digits": "Input: scikit-learn's 8x8 digits, resized to 32x32 and copied into three channels.",
}


def paper_epochs(paper) -> str:
    """'the paper's protocol has 50 (halved every 10)', or, where the paper preset gives each batch size its
    own (experiment.epochs), 'the paper preset has 2, 6, 20 and 20 (halved every 1, 2, 5 and 5) at batch 1,
    10, 50 and 100'."""
    per = paper.experiment.get("epochs")
    if per is None or isinstance(per, int | str):
        return f"the paper's protocol has {paper.train.epochs} (halved every {paper.train.lr_halve_every})"

    def listed(values) -> str:
        values = [str(v) for v in values]
        return ", ".join(values[:-1]) + f" and {values[-1]}" if len(values) > 1 else values[0]

    halves = paper.experiment.get("lr_halve_every") or [paper.train.lr_halve_every] * len(per)
    return (
        f"the paper preset has {listed(per)} (halved every {listed(halves)}) at batch "
        f"{listed(paper.experiment.batch_sizes)}"
    )


def departures(experiment: str, prov: dict, directory: Path | None = None) -> list[str]:
    """Plain sentences wherever a run departs from the paper's protocol."""
    return [sentence for _, sentence in found(experiment, prov, directory)]


def protocol_note(experiment: str, prov: dict) -> list[str]:
    """What differs from the paper's protocol that bears on a verdict, in a few words."""
    return [note for note, _ in found(experiment, prov) if note]


def found(experiment: str, prov: dict, directory: Path | None = None) -> list[tuple[str, str]]:
    """(a few words for a verdict's note, or "" where the verdict needs none; the report's sentence),
    wherever a run departs from the paper's protocol."""
    if not prov:
        return []
    cfg = prov["cfg"]
    paper_sets = paper_datasets(experiment)
    dataset = prov.get("dataset", cfg.dataset.name)
    paper = paper_protocol(experiment, dataset)
    out = []
    if dataset not in paper_sets:
        out.append((
            f"{dataset}, not {paper.dataset.name}: the effect's size is not comparable with the paper's",
            f"Data set: {dataset}, not the paper's {' / '.join(paper_sets)}; the numbers are not "
            "comparable with the paper's, only the trends are.",
        ))  # fmt: skip
    schedules = prov["schedules"]
    if len(schedules) > 1:  # set per batch size by the grid
        each = [f"{e} (the rate halved every {h})" for e, h in schedules]
        each = ", ".join(each[:-1]) + f" or {each[-1]}"
        out.append((f"{epochs_text(prov)} of the paper's {paper.train.epochs} epochs",
                    f"Epochs per setting: {each}; {paper_epochs(paper)}."))  # fmt: skip
    else:
        ((epochs, halve_every),) = schedules
        if epochs != paper.train.epochs:
            out.append((f"{epochs} of the paper's {paper.train.epochs} epochs",
                        f"Epochs: {epochs} per run, the paper's protocol has {paper.train.epochs}."))  # fmt: skip
        if halve_every != paper.train.lr_halve_every:
            out.append(("", f"The learning rate is halved every {halve_every} epochs, the paper's protocol "
                            f"every {paper.train.lr_halve_every}."))  # fmt: skip
    if cfg.model.width != 1.0:
        out.append((f"width {float(cfg.model.width):g}",
                     f"Width: the NIN's hidden widths are scaled by {cfg.model.width} (the paper: 1.0)."))  # fmt: skip
    sentences = []
    if cfg.dataset.get("limit"):
        sentences.append(f"Only {cfg.dataset.limit} examples per split were used.")
    if cfg.dataset.get("train_limit"):
        sentences.append(
            f"Training images: a seeded subset of {cfg.dataset.train_limit:,} of the training split "
            "(validation and test whole)."
        )
    if dataset in INPUTS:
        sentences.append(INPUTS[dataset])
    if cfg.train.get("probe_images"):
        sentences.append(
            f"Probes: the hidden layers' inputs are measured on the first {cfg.train.probe_images:,} test images, "
            "not all of them."
        )
    if prov["seeds"] < int(paper.seeds):
        sentences.append(f"Seeds: {prov['seeds']}, the paper preset uses {paper.seeds}.")
    if directory is not None and augments(directory):
        sentences += augmentation(dataset, cfg.dataset.get("augment"))
    return out + [("", sentence) for sentence in sentences]


def augments(directory: Path) -> bool:
    """Did any run of the sweep train with augmentation (train.augment)?"""
    return any(
        bool((read_yaml(path).get("train") or {}).get("augment", False))
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
