"""Data sets on the device, data normalisation (paper section 4.1) and augmentation.

A training epoch, the cifar10-airbench way::

    ds = load_dataset("cifar10", data_dir="data").to(device)  # uint8 [N, 3, 32, 32]
    norm = make_data_norm("batch", ds.train.x)  # or "global"
    for idx in epoch_batches(len(ds.train), 50, generator, device=device):
        x = norm(flip_batch(ds.train.x[idx], generator))  # float, normalised
        y = ds.train.y[idx]
"""

from .augment import epoch_batches, flip_batch, flip_mask
from .datasets import (
    DATA_FILES,
    DATASETS,
    DataError,
    Dataset,
    Split,
    available_datasets,
    cifar_val_size,
    digits_images,
    load_dataset,
)
from .normalize import DATA_NORMS, BatchDataNorm, GlobalDataNorm, make_data_norm, to_float

__all__ = [
    "DATASETS",
    "DATA_FILES",
    "DATA_NORMS",
    "BatchDataNorm",
    "DataError",
    "Dataset",
    "GlobalDataNorm",
    "Split",
    "available_datasets",
    "cifar_val_size",
    "digits_images",
    "epoch_batches",
    "flip_batch",
    "flip_mask",
    "load_dataset",
    "make_data_norm",
    "to_float",
]
