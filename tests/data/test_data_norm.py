"""Data normalisation (paper section 4.1, 4.5): mean 0 and std 1 per input element."""

import pytest
import torch

from normprop_cli.data import (
    BatchDataNorm,
    GlobalDataNorm,
    load_dataset,
    make_data_norm,
    to_float,
)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


@pytest.fixture(scope="module")
def synthetic():
    return load_dataset("synthetic")


def test_to_float_scale():
    x = torch.tensor([0, 51, 255], dtype=torch.uint8)
    assert torch.allclose(to_float(x), torch.tensor([0.0, 0.2, 1.0]))


# --- global ---------------------------------------------------------------------------


def test_global_norm_gives_each_element_mean_0_std_1_on_train(digits):
    norm = make_data_norm("global", digits.train.x)
    assert isinstance(norm, GlobalDataNorm) and norm.mean.shape == (1, 3, 32, 32)
    z = norm(digits.train.x).double()
    x = digits.train.x
    constant = (x == x[:1]).all(0, keepdim=True)  # e.g. the blank corners of the digits
    assert constant.any() and not constant.all()
    assert z.mean(0, keepdim=True).abs().max() < 1e-4
    std = z.std(0, unbiased=False, keepdim=True)
    assert (std[~constant] - 1).abs().max() < 1e-4
    assert torch.all(norm.std[constant] == 1)  # no division by zero
    assert torch.all(z[:, constant[0]] == 0)  # constant elements are only centred


def test_global_norm_is_exact_chunked_and_the_same_in_eval(synthetic):
    x = synthetic.train.x
    norm = GlobalDataNorm().fit(x, chunk_size=100)
    reference = to_float(x).double()
    assert torch.allclose(norm.mean.double(), reference.mean(0, keepdim=True), atol=1e-7)
    assert torch.allclose(norm.std.double(), reference.std(0, unbiased=False, keepdim=True))
    whole = GlobalDataNorm().fit(x, chunk_size=10_000)
    assert torch.allclose(norm.mean, whole.mean) and torch.allclose(norm.std, whole.std)
    val = synthetic.val.x
    train_mode = norm.train()(val)
    assert torch.equal(train_mode, norm.eval()(val))  # section 4.5: the same statistics


def test_global_norm_state_goes_into_the_state_dict(synthetic):
    norm = make_data_norm("global", synthetic.train.x)
    restored = GlobalDataNorm()
    restored.load_state_dict(norm.state_dict())
    assert set(norm.state_dict()) == {"mean", "std"}
    assert torch.equal(restored(synthetic.val.x), norm(synthetic.val.x))


# --- batch ----------------------------------------------------------------------------


def test_batch_norm_normalises_each_training_batch(synthetic):
    norm = make_data_norm("batch", synthetic.train.x)
    assert isinstance(norm, BatchDataNorm) and norm.training
    z = norm(synthetic.train.x[:64]).double()
    assert z.mean(0).abs().max() < 1e-5
    assert (z.std(0, unbiased=False) - 1).abs().max() < 1e-3


def test_batch_norm_first_batch_sets_the_running_estimate(synthetic):
    norm = BatchDataNorm()
    batch = to_float(synthetic.train.x[:32])
    norm(batch)
    assert torch.allclose(norm.running_mean, batch.mean(0, keepdim=True))
    assert torch.allclose(norm.running_var, batch.var(0, unbiased=True, keepdim=True))
    assert norm.num_batches_tracked == 1


def test_batch_norm_running_estimate_converges_to_the_data(synthetic):
    x = synthetic.train.x[:, :, :8, :8].contiguous()  # a crop: fewer elements, same property
    norm = BatchDataNorm(momentum=0.1, shape=(3, 8, 8))
    g = torch.Generator().manual_seed(0)
    for _ in range(40):  # 40 epochs of 8 batches
        for idx in torch.randperm(len(x), generator=g).split(64):  # an epoch: a seeded permutation cut into batches
            norm(x[idx])
    data = to_float(x).double()
    mean, var = data.mean(0, keepdim=True), data.var(0, unbiased=False, keepdim=True)
    std = var.sqrt()
    mean_error = (norm.running_mean - mean).abs() / std
    assert mean_error.mean() < 0.05 and mean_error.max() < 0.3
    var_error = (norm.running_var / var - 1).abs()
    assert var_error.mean() < 0.05 and var_error.max() < 0.3


def test_batch_norm_eval_uses_the_running_estimate(synthetic):
    norm = make_data_norm("batch", synthetic.train.x)
    for idx in torch.randperm(len(synthetic.train), generator=torch.Generator().manual_seed(0)).split(50):
        norm(synthetic.train.x[idx])
    state = {k: v.clone() for k, v in norm.state_dict().items()}
    norm.eval()
    one = synthetic.val.x[:1]  # batch size 1 is fine in evaluation
    expected = (to_float(one) - norm.running_mean) / torch.sqrt(norm.running_var + norm.eps)
    assert torch.equal(norm(one), expected)
    norm(synthetic.val.x)
    for k, v in norm.state_dict().items():
        assert torch.equal(v, state[k])  # evaluation does not update the estimate
    restored = BatchDataNorm()
    restored.load_state_dict(norm.state_dict())
    assert torch.equal(restored.eval()(one), expected)


def test_batch_norm_refuses_batch_size_1_in_training(synthetic):
    norm = make_data_norm("batch", synthetic.train.x)
    with pytest.raises(ValueError) as exc:
        norm(synthetic.train.x[:1])
    message = str(exc.value)
    assert "\n" not in message and "data_norm=global" in message
    assert norm.num_batches_tracked == 0


def test_make_data_norm_rejects_unknown_kinds(synthetic):
    with pytest.raises(ValueError) as exc:
        make_data_norm("whitening", synthetic.train.x)
    assert "global" in str(exc.value) and "batch" in str(exc.value)
