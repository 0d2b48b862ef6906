"""Centred filters (nn/centred.py, the method normprop-centred) and the mean oracle (nn/oracle.py)."""

import torch
import torch.nn.functional as F

from normprop_cli.nn.centred import CentredNormPropConv2d, CentredNormPropLinear, centre_rows
from normprop_cli.nn.layers import NormPropConv2d, constrain_unit_norm_, reference_forward
from normprop_cli.nn.methods import METHODS
from normprop_cli.nn.nin import NIN
from normprop_cli.nn.oracle import OracleConv2d, SigmaOracleConv2d, normprop_conv


def test_centred_rows_sum_to_zero_and_keep_their_shape():
    w = torch.randn(6, 3, 5, 5, generator=torch.Generator().manual_seed(0)) + 0.3
    v = centre_rows(w)
    assert v.shape == w.shape
    assert v.flatten(1).sum(1).abs().max() < 1e-5
    assert torch.allclose(centre_rows(v), v, atol=1e-6)


# eq. 9 / 11 with f = 1 (jacobian="off"), as NormProp's own propagation tests: dividing by the Jacobian
# factor shrinks the pre-activation on purpose (section 3.4), for centred filters as for NormProp's


def test_eq9_centred_linear_gives_n01_units_at_init_on_n01_input():
    torch.manual_seed(0)
    layer = CentredNormPropLinear(64, 32, jacobian="off")
    x = torch.randn(20000, 64)
    with torch.no_grad():
        out = layer(x)
    assert out.mean(0).abs().max() < 0.05
    assert (out.std(0) - 1).abs().max() < 0.05


def test_eq11_centred_conv_gives_n01_units_at_init_on_n01_input():
    torch.manual_seed(1)
    layer = CentredNormPropConv2d(8, 16, 3, jacobian="off")
    x = torch.randn(400, 8, 10, 10)
    with torch.no_grad():
        out = layer(x).transpose(0, 1).flatten(1)  # [channel, images x positions]
    assert out.mean(1).abs().max() < 0.05
    assert (out.std(1) - 1).abs().max() < 0.05


def test_a_common_input_mean_never_reaches_the_pre_activation():
    # V_i^T (m 1) = 0: shifting every input unit by m changes nothing, whatever the (trained, uncentred) filter
    torch.manual_seed(2)
    layer = CentredNormPropConv2d(4, 6, 3)
    plain = NormPropConv2d(4, 6, 3)
    with torch.no_grad():
        for m in (layer, plain):
            m.weight.add_(0.2)  # filters with a mean of their own, as training leaves them
            m.gamma.uniform_(0.5, 2.0)
        plain.load_state_dict(layer.state_dict())
        x = torch.randn(5, 4, 9, 9)
        assert torch.allclose(layer(x + 1.5), layer(x), atol=1e-5)
        assert not torch.allclose(plain(x + 1.5), plain(x), atol=1e-2)


def test_the_centred_forward_is_the_term_by_term_form_and_batch_independent():
    torch.manual_seed(3)
    layer = CentredNormPropConv2d(3, 5, 3, padding=1)
    with torch.no_grad():
        layer.weight.add_(0.1)
        layer.beta.uniform_(-0.5, 0.5)
        x = torch.randn(4, 3, 8, 8)
        out = layer(x)
        assert torch.allclose(out, reference_forward(layer, x), atol=1e-5)
        assert torch.allclose(out[1:2], layer(x[1:2]), atol=1e-6)  # one image alone: the same output


def test_the_centred_layer_folds_into_one_conv_and_a_clamp_for_inference():
    torch.manual_seed(4)
    layer = CentredNormPropConv2d(3, 4, 3)
    with torch.no_grad():
        layer.weight.add_(0.1)
        layer.gamma.uniform_(0.5, 2.0)
        st, f = layer.stats(), layer.divisor()
        v = centre_rows(layer.weight)
        scale = layer.gamma / (f * st.std * v.flatten(1).norm(dim=1))
        x = torch.randn(2, 3, 7, 7)
        folded = F.conv2d(x, v * scale.view(-1, 1, 1, 1), (layer.beta - st.mean) / st.std).clamp_min(-st.mean / st.std)
        assert torch.allclose(layer(x), folded, atol=1e-5)


def test_only_the_centred_function_is_seen_so_the_gradient_keeps_the_filter_mean():
    torch.manual_seed(5)
    layer = CentredNormPropConv2d(3, 4, 3)
    layer(torch.randn(2, 3, 6, 6)).square().sum().backward()
    assert layer.weight.grad.flatten(1).sum(1).abs().max() < 1e-4
    constrain_unit_norm_(layer)  # the unit-norm projection still acts on W_i
    assert torch.allclose(layer.weight.flatten(1).norm(dim=1), torch.ones(4), atol=1e-5)


def test_model_center_builds_centred_layers_and_no_method_is_registered_for_it():
    # centred filters did not remove the drift (results/fashion/drift), so they stay an ablation option
    assert "normprop-centred" not in METHODS
    model = NIN(10, 1, "normprop", 0.125, center=True)
    assert all(isinstance(m, CentredNormPropConv2d) for m in model.hidden_layers())
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 10)


def test_the_mean_oracle_subtracts_w_i_t_m_and_the_classes_are_chosen_by_option():
    torch.manual_seed(6)
    oracle = OracleConv2d(2, 3, 3, sigma=False, mean=True)
    plain = NormPropConv2d(2, 3, 3)
    plain.load_state_dict({k: v for k, v in oracle.state_dict().items() if k in plain.state_dict()})
    m = torch.tensor([0.7, -0.2]).repeat_interleave(9)  # a per-channel input mean, as a patch vector
    oracle.set_moments(m.double(), None)
    x = torch.randn(3, 2, 6, 6)
    shifted = x + torch.tensor([0.7, -0.2]).view(1, 2, 1, 1)
    with torch.no_grad():
        assert torch.allclose(oracle(shifted), plain(x), atol=1e-5)  # no padding: every patch is full
    assert normprop_conv() is NormPropConv2d and normprop_conv(sigma_oracle=True) is SigmaOracleConv2d
    assert normprop_conv(center=True) is CentredNormPropConv2d
    assert normprop_conv(sigma_oracle=True, mean_oracle=True)(2, 3, 3).extra_repr().endswith("oracle=mean+sigma")
