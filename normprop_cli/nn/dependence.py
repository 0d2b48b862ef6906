"""Which positions of a conv layer's input depend on the image, from the architecture alone.

NIN's conv 8, C(192,1,1,2), is a 1x1 convolution padded by 2 on a 4x4 map: the 2-pixel border of
its 8x8 output sees only padding, so it holds the bias (after the activation, a constant) whatever
the image. A probe of "the input of a unit" (Fig. 2) must not land there.

The answer is structural, independent of the weights: a 1-channel mask of ones is pushed through a
surrogate of the network in which every conv is a conv with an all-ones kernel of the same size,
stride and padding and no bias, and every pooling a max-pooling of the same geometry; a positive
value means that some image pixel reaches the position. Elementwise modules (activations,
BatchNorm in evaluation mode) keep the mask; a normalisation whose statistics are taken over
positions (group, layer, instance norm) spreads dependence to every position of the map.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

POOLS = (nn.MaxPool2d, nn.AvgPool2d)
SPATIAL_NORMS = (nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)


def conv_of(layer: nn.Module) -> nn.Module:
    """The convolution of a hidden layer: the layer itself (nn.Conv2d, NormPropConv2d) or the first
    module inside it with a kernel (a block such as nn.Sequential(conv, norm, activation))."""
    for m in layer.modules():
        if all(hasattr(m, a) for a in ("kernel_size", "stride", "padding")):
            return m
    raise ValueError(f"no convolution found in {type(layer).__name__}")


def _through_conv(conv: nn.Module, mask: Tensor) -> Tensor:
    kernel = conv.kernel_size if isinstance(conv.kernel_size, tuple) else (conv.kernel_size,) * 2
    ones = torch.ones(1, 1, *kernel, dtype=mask.dtype)
    return F.conv2d(mask, ones, None, conv.stride, conv.padding, getattr(conv, "dilation", 1))


def _through_layer(layer: nn.Module, mask: Tensor) -> Tensor:
    conv = conv_of(layer)
    mask = _through_conv(conv, mask)
    if any(isinstance(m, SPATIAL_NORMS) for m in layer.modules()):
        mask = mask.amax().expand_as(mask)
    return mask


@torch.no_grad()
def input_dependent(model: nn.Module, in_shape: tuple[int, ...] = (3, 32, 32)) -> dict[int, Tensor]:
    """{k: bool [H, W]} for the conv layers k = 1, 2, ... of `model.hidden_layers()`: True where the
    map entering conv k depends on the image. `model.features` is the network in order (NIN)."""
    convs = {id(m): k for k, m in enumerate(model.hidden_layers(), start=1)}
    mask = torch.ones(1, 1, *in_shape[-2:], dtype=torch.float64)
    masks = {}
    for module in model.features:
        if id(module) in convs:
            masks[convs[id(module)]] = mask[0, 0] > 0
            mask = _through_layer(module, mask)
        elif isinstance(module, POOLS):
            mask = F.max_pool2d(mask, module.kernel_size, module.stride, module.padding, ceil_mode=module.ceil_mode)
        elif isinstance(module, SPATIAL_NORMS):
            mask = mask.amax().expand_as(mask)
        mask = (mask > 0).to(torch.float64)
    return masks
