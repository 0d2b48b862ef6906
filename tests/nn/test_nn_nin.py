"""The NIN backbone of section 5 with every normalisation."""

import pytest
import torch
from torch import nn

from normprop_cli.nn import NIN, NORMS, NormPropConv2d, constrain_unit_norm_, register_norm


# (in, out, kernel) of the nine convs of C(192,5,1,2)-C(160,1,1,0)-...-C(K,1,1,0)
def convs(k):
    return [
        (3, 192, 5),
        (192, 160, 1),
        (160, 96, 1),
        (96, 192, 5),
        (192, 192, 1),
        (192, 192, 1),
        (192, 192, 5),
        (192, 192, 1),
        (192, k, 1),
    ]


@pytest.mark.parametrize("norm", ["none", "batchnorm", "normprop"])
@pytest.mark.parametrize("classes", [10, 100])
def test_logits_shape(norm, classes):
    torch.manual_seed(0)
    model = NIN(num_classes=classes, norm=norm).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, classes) and torch.isfinite(out).all()


def test_parameter_counts_by_hand():
    weights = sum(i * o * k * k for i, o, k in convs(10))
    outputs = sum(o for _, o, _ in convs(10))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(NIN(10, norm="none")) == weights + outputs  # + biases
    assert count(NIN(10, norm="normprop")) == weights + 2 * outputs  # + gammas and betas
    assert count(NIN(10, norm="batchnorm")) == weights + 2 * outputs - 10  # BN affine; bias on K
    assert count(NIN(10, norm="normprop", activation="prelu")) == weights + 2 * outputs + 8


def test_hidden_layers_and_spatial_sizes():
    model = NIN(10, norm="normprop", width=0.25)
    layers = model.hidden_layers()
    assert len(layers) == 9 and all(isinstance(m, NormPropConv2d) for m in layers)
    assert layers[-1].activation == "identity" and layers[-1].out_channels == 10
    assert [m.out_channels for m in layers[:-1]] == [48, 40, 24, 48, 48, 48, 48, 48]
    sizes = []
    hooks = [m.register_forward_hook(lambda m, inp, out: sizes.append(inp[0].shape[-1])) for m in layers]
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    for h in hooks:
        h.remove()
    assert sizes == [32, 32, 16, 16, 16, 8, 8, 4, 8]  # input of layers 1..9
    assert isinstance(model.features.pool1, nn.MaxPool2d)
    assert isinstance(model.features.pool2, nn.AvgPool2d)


def test_batchnorm_and_none_blocks():
    bn = NIN(10, norm="batchnorm", width=0.25).hidden_layers()
    assert all(isinstance(b[1], nn.BatchNorm2d) and b[0].bias is None for b in bn[:-1])
    assert isinstance(bn[-1], nn.Conv2d) and bn[-1].bias is not None  # plain classifier
    plain = NIN(10, norm="none", width=0.25).hidden_layers()
    assert all(isinstance(b[0], nn.Conv2d) and isinstance(b[1], nn.ReLU) for b in plain[:-1])


def test_width_multiplier_never_reaches_zero():
    model = NIN(10, norm="none", width=0.001)
    assert [b[0].out_channels for b in model.hidden_layers()[:-1]] == [1] * 8
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_normprop_trains_at_batch_size_1_and_is_the_same_in_eval():
    torch.manual_seed(0)
    model = NIN(10, norm="normprop", width=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    x, y = torch.randn(1, 3, 32, 32), torch.tensor([3])
    before = [p.detach().clone() for p in model.parameters()]
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    constrain_unit_norm_(model)
    assert torch.isfinite(loss)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    with torch.no_grad():  # section 4.5: validation is the training computation
        torch.testing.assert_close(model.eval()(x), model.train()(x))


def test_activation_and_jacobian_reach_the_layers():
    model = NIN(10, norm="normprop", width=0.1, activation="tanh", jacobian="init")
    hidden = model.hidden_layers()
    assert all(m.activation == "tanh" and m.jacobian == "init" for m in hidden[:-1])
    assert NIN(10, norm="none", width=0.1, activation="tanh")(torch.randn(1, 3, 32, 32)).shape == (
        1,
        10,
    )


def test_register_norm_and_unknown_norm():
    def block(i, o, k, s, p, **_):
        return nn.Sequential(nn.Conv2d(i, o, k, s, p), nn.GELU())

    try:
        register_norm("gelu-plain", block, lambda i, o, k, s, p, **_: nn.Conv2d(i, o, k, s, p))
        model = NIN(10, norm="gelu-plain", width=0.1)
        assert isinstance(model.hidden_layers()[0][1], nn.GELU)
    finally:
        NORMS.pop("gelu-plain", None)
    with pytest.raises(ValueError, match="model.norm=no-such-norm is not known"):
        NIN(10, norm="no-such-norm")


def test_feature_sizes_are_the_forward_pass_sizes():
    from normprop_cli.nn.nin import feature_sizes

    model, seen = NIN(10, norm="batchnorm", width=0.0625), []
    for layer in model.features:
        layer.register_forward_hook(lambda m, i, o: seen.append(o.shape[-1]))
    model(torch.randn(2, 3, 32, 32))
    assert seen == [size for _, size in feature_sizes(32)]


def test_values_per_channel_of_batch_statistics_layers():
    """BN and BRN normalise a hidden conv's output over the batch and its positions; the smallest is
    the 4x4 output of the 5x5 conv without padding. Batch-independent norms have no such count."""
    from normprop_cli.nn.nin import values_per_channel

    assert values_per_channel("batchnorm", 1) == 16
    assert values_per_channel("batchrenorm", 3) == 48
    assert values_per_channel("groupnorm", 1) is None and values_per_channel("normprop", 1) is None


def test_nin_config_is_typed_and_refuses_unknown_options():
    from normprop_cli.nn.nin import NINConfig

    config = NINConfig.from_dict({"norm": "batchnorm", "width": 0.25})
    model = NIN(10, config=config, activation="tanh")  # keywords replace fields of the config
    assert model.config == NINConfig(norm="batchnorm", width=0.25, activation="tanh")
    with pytest.raises(ValueError, match="model.depth is not a NIN option"):
        NINConfig.from_dict({"depth": 9})
    assert NINConfig(norm="frn", activation="tanh").problem() == (
        "model.norm=frn takes model.activation=relu, not tanh"
    )


@pytest.mark.parametrize("norm", ["normprop", "batchnorm"])
def test_an_input_under_the_smallest_size_is_refused_at_once_naming_it(norm):
    """MIN_IMAGE_SIZE comes from ARCHITECTURE (feature_sizes); checked here against the real layers: the
    smallest size runs, one pixel less fails in torch's own pooling, and NIN says so in one line first."""
    from normprop_cli.nn.nin import MIN_IMAGE_SIZE

    model, n = NIN(10, norm=norm, width=0.0625).eval(), MIN_IMAGE_SIZE
    with torch.no_grad():
        assert model(torch.randn(2, 3, n, n)).shape == (2, 10)
        with pytest.raises(RuntimeError, match="too small"):  # the layers themselves, the check bypassed
            model.features(torch.randn(2, 3, n - 1, n - 1))
        for h, w in ((n - 1, n - 1), (28, 28), (32, n - 1), (n - 1, 32)):
            with pytest.raises(ValueError, match=rf"at least {n}x{n}.*got {h}x{w}") as exc:
                model(torch.randn(2, 3, h, w))
            assert "\n" not in str(exc.value)
    assert n == 29  # 29 -> 15 -> 8 -> 4 -> 8 -> 1, as the NIN docstring says
