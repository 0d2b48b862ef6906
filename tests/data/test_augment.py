"""Augmentation on the device: an epoch's draws (flip masks, shifts) and each batch's slice of them."""

import pytest
import torch

from normprop_cli.data import augment_batch, draw_augmentation, flip_mask
from normprop_cli.data.augment import translate_batch


def images(n=16):
    return torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(1)).to(torch.uint8)


def test_a_flip_mask_flips_exactly_the_masked_images():
    x = images()
    mask = torch.zeros(len(x), dtype=torch.bool)
    mask[[0, 3, 7, 8]] = True
    out = augment_batch(x, mask)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    assert torch.equal(out[mask], x[mask].flip(-1))  # left-right: the width axis
    assert torch.equal(out[mask][:, :, :, 0], x[mask][:, :, :, -1])
    assert torch.equal(out[~mask], x[~mask])
    assert torch.equal(x, images())  # the input is untouched
    assert augment_batch(x, None) is x  # no augmentation


def test_flips_are_reproducible_from_the_generator_seed():
    a = draw_augmentation("flip", 64, torch.Generator().manual_seed(5))
    assert a.dtype == torch.bool and torch.equal(a, flip_mask(64, torch.Generator().manual_seed(5)))
    assert 0 < a.sum() < 64
    many = flip_mask(10_000, torch.Generator().manual_seed(0))
    assert 0.45 < many.float().mean() < 0.55  # a random half
    assert draw_augmentation("none", 64, torch.Generator()) is None
    with pytest.raises(ValueError, match="flip, translate, none"):
        draw_augmentation("rotate", 64, torch.Generator())


def test_a_flip_mask_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError):
        augment_batch(images(4), torch.ones(3, dtype=torch.bool))


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
    for bound in (3, 5):  # a known bound on the shifts (the trainer's: no read-back of the largest) changes nothing
        assert torch.equal(translate_batch(x, shifts, bound), out)
        assert torch.equal(augment_batch(x, shifts, bound), out)


def test_translation_keeps_labels_and_shapes_in_a_training_epoch():
    """Digits get translations, not flips: an epoch's draws are shifts within the
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
