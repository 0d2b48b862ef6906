"""Batches as seeded index slices and horizontal flips on the device."""

import pytest
import torch

from normprop_cli.data import epoch_batches, flip_batch, flip_mask
from normprop_cli.data.augment import augment_batch, translate_batch


def images(n=16):
    return torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(1)).to(torch.uint8)


def test_flip_batch_flips_exactly_the_masked_images():
    x = images()
    mask = torch.zeros(len(x), dtype=torch.bool)
    mask[[0, 3, 7, 8]] = True
    out = flip_batch(x, mask)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    assert torch.equal(out[mask], x[mask].flip(-1))  # left-right: the width axis
    assert torch.equal(out[mask][:, :, :, 0], x[mask][:, :, :, -1])
    assert torch.equal(out[~mask], x[~mask])
    assert torch.equal(x, images())  # the input is untouched


def test_flip_batch_is_reproducible_from_the_generator_seed():
    x = images(64)
    a = flip_batch(x, torch.Generator().manual_seed(5))
    b = flip_batch(x, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    mask = flip_mask(64, torch.Generator().manual_seed(5))
    assert torch.equal(a, flip_batch(x, mask))
    assert 0 < mask.sum() < 64
    many = flip_mask(10_000, torch.Generator().manual_seed(0))
    assert 0.45 < many.float().mean() < 0.55  # a random half


def test_flip_batch_rejects_a_mask_of_the_wrong_size():
    with pytest.raises(ValueError):
        flip_batch(images(4), torch.ones(3, dtype=torch.bool))


def test_epoch_batches_cover_every_example_once():
    g = torch.Generator().manual_seed(0)
    batches = epoch_batches(103, 10, g)
    assert [len(b) for b in batches] == [10] * 10 + [3]
    assert torch.equal(torch.cat(batches).sort().values, torch.arange(103))
    assert [len(b) for b in epoch_batches(103, 10, g, drop_last=True)] == [10] * 10
    assert epoch_batches(5, 1, g, device="cpu")[0].device.type == "cpu"


def test_epoch_batches_are_seeded_and_resumable():
    first = epoch_batches(50, 8, torch.Generator().manual_seed(3))
    again = epoch_batches(50, 8, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    g = torch.Generator().manual_seed(3)
    epoch_batches(50, 8, g)
    state = g.get_state()
    second = epoch_batches(50, 8, g)
    assert not torch.equal(torch.cat(second), torch.cat(first))  # a new order each epoch
    resumed = torch.Generator()
    resumed.set_state(state)
    assert torch.equal(torch.cat(epoch_batches(50, 8, resumed)), torch.cat(second))


def test_translate_batch_moves_each_image_by_its_shift_with_zero_fill():
    x = images(3)
    shifts = torch.tensor([[0, 0], [2, -1], [-3, 3]])
    out = translate_batch(x, shifts)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    assert torch.equal(out[0], x[0])  # no shift: the image itself
    assert torch.equal(out[1][:, 2:, :-1], x[1][:, :-2, 1:])  # down 2, left 1
    assert (out[1][:, :2] == 0).all() and (out[1][:, :, -1:] == 0).all()  # what came from outside is 0
    assert torch.equal(out[2][:, :-3, 3:], x[2][:, 3:, :-3])  # up 3, right 3
    assert torch.equal(x, images(3))  # the input is untouched


def test_translation_keeps_labels_and_shapes_in_a_training_epoch():
    """Digits get translations, not flips (SPEC §6.1): an epoch's draws are shifts within the
    data set's range; labels are indexed apart from the images, so augmenting never touches them."""
    from omegaconf import OmegaConf

    from normprop_cli.engine.trainer import augmentation

    cfg = OmegaConf.create({"train": {"augment": True}, "dataset": {"augment": "translate", "translate_pixels": 3}})
    drawn = augmentation(cfg, 5000, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert drawn.shape == (5000, 2) and drawn.dtype == torch.int64
    assert set(drawn.unique().tolist()) == set(range(-3, 4))
    x, y = images(16), torch.arange(16) % 10
    out = augment_batch(x, drawn[:16])
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.equal(y, torch.arange(16) % 10)
    # a translated digit is the same digit, moved: its pixels are a subset of the original's
    for image, moved, (dy, dx) in zip(x, out, drawn[:16].tolist(), strict=True):
        assert torch.equal(moved, translate_batch(image[None], torch.tensor([[dy, dx]]))[0])
    cfg.dataset.augment = "flip"
    assert augmentation(cfg, 8, torch.Generator().manual_seed(0), torch.device("cpu")).dtype == torch.bool
    cfg.train.augment = False
    assert augmentation(cfg, 8, torch.Generator().manual_seed(0), torch.device("cpu")) is None


def test_translate_batch_rejects_shifts_of_the_wrong_shape():
    with pytest.raises(ValueError):
        translate_batch(images(4), torch.zeros(3, 2, dtype=torch.long))
