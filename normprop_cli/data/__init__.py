"""Data sets on the device, data normalisation (paper section 4.1) and augmentation.

A training epoch, the cifar10-airbench way (what engine.trainer.train_epoch does)::

    ds = load_dataset("cifar10", data_dir="data").to(device)  # uint8 [N, 3, 32, 32]
    norm = make_data_norm("batch", ds.train.x)  # or "global"
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)  # the epoch's draws, on the CPU
    order = torch.randperm(len(ds.train), generator=gen).to(device)
    drawn = draw_augmentation("flip", len(ds.train), gen).to(device)  # or "translate" (with max_shift)
    for step in range(len(ds.train) // 50):  # the last, shorter batch is dropped
        rows = slice(step * 50, (step + 1) * 50)
        idx = order[rows]
        x = norm(augment_batch(ds.train.x[idx], drawn[rows]))  # float, normalised
        y = ds.train.y[idx]
"""

from .augment import augment_batch, draw_augmentation, flip_mask
from .base import DATA_FILES, DataError, Dataset, Split
from .cifar import cifar_val_size
from .datasets import DATASETS, available_datasets, load_dataset
from .digits import digits_images
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
    "augment_batch",
    "available_datasets",
    "cifar_val_size",
    "digits_images",
    "draw_augmentation",
    "flip_mask",
    "load_dataset",
    "make_data_norm",
    "to_float",
]
