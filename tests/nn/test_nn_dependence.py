"""Which positions of a conv layer's input depend on the image (the Fig. 2 probe must avoid the rest)."""

import pytest
import torch
from torch import nn

from normprop_cli.nn import NIN, NORMS, input_dependent, register_norm


@pytest.mark.parametrize("norm", ["none", "batchnorm", "normprop"])
def test_only_the_centre_of_conv_9s_input_depends_on_the_image(norm):
    masks = input_dependent(NIN(norm=norm, width=0.0625))
    assert sorted(masks) == list(range(1, 10))
    # conv 7 (5x5, no padding) leaves 4x4; conv 8 = C(192,1,1,2) pads it to 8x8 with a bias-only border
    centre = torch.zeros(8, 8, dtype=torch.bool)
    centre[2:6, 2:6] = True
    assert torch.equal(masks[9], centre)
    sizes = {1: 32, 2: 32, 3: 16, 4: 16, 5: 16, 6: 8, 7: 8, 8: 4}  # pool 1 after conv 2, pool 2 after conv 5
    for k, size in sizes.items():
        assert masks[k].shape == (size, size) and masks[k].all(), k


@pytest.mark.parametrize("norm", ["none", "batchnorm", "normprop"])
def test_changing_the_image_changes_conv_9s_input_exactly_where_the_mask_says(norm):
    torch.manual_seed(0)
    model = NIN(norm=norm, width=0.0625).eval()
    seen = []
    model.hidden_layers()[8].register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0]))
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    changed = (seen[0][0] != seen[0][1]).any(0)  # over channels
    assert torch.equal(changed, input_dependent(model)[9])


def test_a_normalisation_over_positions_makes_every_position_depend_on_the_image():
    def group_norm_block(i, o, k, s, p, **_):
        return nn.Sequential(nn.Conv2d(i, o, k, s, p), nn.GroupNorm(1, o), nn.ReLU())

    register_norm("test-groupnorm", group_norm_block, lambda i, o, k, s, p, **_: nn.Conv2d(i, o, k, s, p))
    try:
        masks = input_dependent(NIN(norm="test-groupnorm", width=0.0625))
    finally:
        del NORMS["test-groupnorm"]
    assert masks[9].shape == (8, 8) and masks[9].all()  # the border's (b - mean(x)) / std(x) moves with x
