"""Data sets: formats, splits, one-line errors."""

import inspect
import json
import pickle
import urllib.error

import numpy as np
import pytest
import torch
import torchvision.datasets

from normprop_cli.data import (
    DATASETS,
    DataError,
    Split,
    available_datasets,
    cifar_val_size,
    load_dataset,
)
from normprop_cli.data.datasets import load_svhn


def image_keys(x) -> list[bytes]:
    """One key per image, to find loaded images in the files they came from."""
    x = x.numpy() if isinstance(x, torch.Tensor) else x
    return [img.tobytes() for img in x]


def assert_one_line_error(exc, *parts):
    message = str(exc.value)
    assert "\n" not in message
    for part in parts:
        assert str(part) in message, (part, message)


def check_split_types(ds, num_classes):
    for split in (ds.train, ds.val, ds.test):
        assert split.x.dtype == torch.uint8 and split.x.shape[1:] == (3, 32, 32)
        assert split.y.dtype == torch.int64 and split.y.shape == (len(split),)
        assert 0 <= split.y.min() and split.y.max() < num_classes
    assert ds.num_classes == num_classes and ds.in_channels == 3
    json.dumps(ds.info)


# --- CIFAR ----------------------------------------------------------------------------


def test_val_size_rule():
    assert cifar_val_size(50_000) == 5_000  # the paper: 45,000 / 5,000
    assert cifar_val_size(300) == 30  # smaller files keep 10 %


@pytest.mark.parametrize("bytes_keys", [True, False])
def test_cifar10_loads_the_python_pickles(tmp_path, write_cifar10, bytes_keys):
    written = write_cifar10(tmp_path, n_per_batch=60, n_test=50, bytes_keys=bytes_keys)
    ds = load_dataset("cifar10", data_dir=tmp_path)
    check_split_types(ds, 10)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (270, 30, 50)
    assert ds.info["sizes"] == {"train": 270, "val": 30, "test": 50}
    # images come back in [N, C, H, W] with their labels
    source = dict(zip(image_keys(written["train"][0]), written["train"][1].tolist(), strict=True))
    for key, label in zip(image_keys(ds.train.x), ds.train.y.tolist(), strict=True):
        assert source[key] == label
    assert torch.equal(ds.test.x, torch.from_numpy(written["test"][0]))
    assert torch.equal(ds.test.y, torch.from_numpy(written["test"][1]))


def test_cifar_split_is_disjoint_covering_and_seeded(tmp_path, write_cifar10):
    written = write_cifar10(tmp_path)
    a = load_dataset("cifar10", data_dir=tmp_path, split_seed=0)
    b = load_dataset("cifar10", data_dir=tmp_path, split_seed=0)
    c = load_dataset("cifar10", data_dir=tmp_path, split_seed=1)
    train, val = set(image_keys(a.train.x)), set(image_keys(a.val.x))
    assert not train & val
    assert train | val == set(image_keys(written["train"][0]))
    assert torch.equal(a.val.x, b.val.x) and torch.equal(a.train.y, b.train.y)
    assert a.info["val_indices_sha1"] == b.info["val_indices_sha1"]
    assert set(image_keys(c.val.x)) != val
    assert a.info["val_indices_sha1"] != c.info["val_indices_sha1"]


def test_cifar100_uses_fine_labels(tmp_path, write_cifar100):
    written = write_cifar100(tmp_path, n_train=200, n_test=40)
    ds = load_dataset("cifar100", data_dir=tmp_path)
    check_split_types(ds, 100)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (180, 20, 40)
    assert torch.equal(ds.test.y, torch.from_numpy(written["test"][1]))
    assert set(image_keys(ds.train.x)) | set(image_keys(ds.val.x)) == set(image_keys(written["train"][0]))


# --- SVHN -----------------------------------------------------------------------------


def test_svhn_default_validation_is_the_papers():
    assert inspect.signature(load_svhn).parameters["val_per_class"].default == (400, 200)


def test_svhn_split_per_class_from_train_and_extra(tmp_path, write_svhn):
    written = write_svhn(tmp_path, per_class=(12, 8), n_test=30)
    ds = load_dataset("svhn", data_dir=tmp_path, val_per_class=(4, 2))
    check_split_types(ds, 10)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (200 - 60, 60, 30)
    assert ds.info["val_per_class"] == {"train": 4, "extra": 2}
    assert ds.info["source_sizes"] == {"train": 120, "extra": 80, "test": 30}

    labels = {}
    origin = {}
    for split in ("train", "extra"):
        for key, label in zip(image_keys(written[split][0]), written[split][1], strict=True):
            labels[key], origin[key] = int(label), split
    val_keys = image_keys(ds.val.x)
    for digit in range(10):  # label 10 in the file is digit 0
        from_train = [k for k in val_keys if labels[k] == digit and origin[k] == "train"]
        from_extra = [k for k in val_keys if labels[k] == digit and origin[k] == "extra"]
        assert (len(from_train), len(from_extra)) == (4, 2)
    assert [labels[k] for k in val_keys] == ds.val.y.tolist()
    train_keys = set(image_keys(ds.train.x))
    assert not train_keys & set(val_keys)
    assert train_keys | set(val_keys) == set(labels)
    assert torch.equal(ds.test.x, torch.from_numpy(written["test"][0]))
    assert torch.equal(ds.test.y, torch.from_numpy(written["test"][1]))

    again = load_dataset("svhn", data_dir=tmp_path, val_per_class=(4, 2))
    other = load_dataset("svhn", data_dir=tmp_path, val_per_class=(4, 2), split_seed=1)
    assert torch.equal(again.val.x, ds.val.x)
    assert not torch.equal(other.val.x, ds.val.x)


# --- errors ---------------------------------------------------------------------------

CIFAR10_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
SVHN_FILES = ["train_32x32.mat", "extra_32x32.mat", "test_32x32.mat"]


def test_unknown_dataset_lists_the_known_ones():
    with pytest.raises(DataError) as exc:
        load_dataset("mnist")
    assert_one_line_error(exc, "mnist", *DATASETS)


def test_missing_directory(tmp_path):
    with pytest.raises(DataError) as exc:
        load_dataset("cifar10", data_dir=tmp_path / "nowhere")
    assert_one_line_error(exc, *CIFAR10_FILES, tmp_path / "nowhere", "--download")
    with pytest.raises(DataError) as exc:
        load_dataset("svhn", data_dir=tmp_path / "nowhere")
    assert_one_line_error(exc, *SVHN_FILES, tmp_path / "nowhere", "--download")


def test_missing_file(tmp_path, write_cifar10, write_cifar100):
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataError) as exc:
        load_dataset("cifar10", data_dir=tmp_path)
    assert_one_line_error(exc, *CIFAR10_FILES, "missing: data_batch_3", tmp_path, "--download")

    write_cifar100(tmp_path)
    (tmp_path / "cifar-100-python" / "test").unlink()
    with pytest.raises(DataError) as exc:
        load_dataset("cifar100", data_dir=tmp_path)
    assert_one_line_error(exc, "train", "missing: test", tmp_path / "cifar-100-python")


def test_svhn_without_extra_says_it_is_required(tmp_path, write_svhn):
    write_svhn(tmp_path, splits=("train", "test"))
    with pytest.raises(DataError) as exc:
        load_dataset("svhn", data_dir=tmp_path)
    assert_one_line_error(exc, *SVHN_FILES, "missing: extra_32x32.mat", "required", "--download")


def test_truncated_pickle(tmp_path, write_cifar10):
    write_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DataError) as exc:
        load_dataset("cifar10", data_dir=tmp_path)
    assert_one_line_error(exc, "data_batch_2", "corrupt", *CIFAR10_FILES, tmp_path, "--download")


def test_pickle_with_wrong_shapes(tmp_path, write_cifar10):
    write_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    with open(path, "wb") as f:
        pickle.dump({b"data": np.zeros((5, 100), np.uint8), b"labels": [0] * 5}, f)
    with pytest.raises(DataError) as exc:
        load_dataset("cifar10", data_dir=tmp_path)
    assert_one_line_error(exc, "test_batch", "3072", tmp_path, "--download")


class _Payload:
    """Unpickled, it creates a file (the harmless stand-in for os.system): the trace of code run by a pickle."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("protocol", [2, 5])
def test_a_pickle_that_would_run_code_is_refused_as_corrupt(tmp_path, write_cifar10, protocol):
    write_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    live = tmp_path / "live"
    pickle.loads(pickle.dumps(_Payload(live), protocol=protocol)).close()  # plain pickle runs it
    assert live.exists()
    marker = tmp_path / "ran"
    with open(path, "wb") as f:
        pickle.dump({b"data": _Payload(marker), b"labels": [0] * 5}, f, protocol=protocol)
    with pytest.raises(DataError) as exc:
        load_dataset("cifar10", data_dir=tmp_path)
    assert not marker.exists()
    assert_one_line_error(exc, "data_batch_3", "corrupt", "refused", "open", tmp_path, "--download")


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_the_restricted_unpickler_reads_every_protocol_and_numpy_1s_names(tmp_path, write_cifar10, protocol):
    """Arrays as numpy 2 writes them under each protocol, and as numpy 1 named them (the original files)."""
    written = write_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    x, y = written["test"]
    data = pickle.dumps({b"data": x.reshape(len(x), -1), b"labels": [int(v) for v in y]}, protocol=protocol)
    if protocol <= 2:  # GLOBAL opcodes name the module in text: name it as numpy 1's pickles did
        data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
        assert b"numpy.core.multiarray" in data
    path.write_bytes(data)
    ds = load_dataset("cifar10", data_dir=tmp_path)
    assert torch.equal(ds.test.x, torch.from_numpy(x)) and torch.equal(ds.test.y, torch.from_numpy(y))


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_mat(tmp_path, write_svhn, damage):
    write_svhn(tmp_path)
    path = tmp_path / "test_32x32.mat"
    data = path.read_bytes()
    path.write_bytes(b"not a mat file\n" * 20 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(DataError) as exc:
        load_dataset("svhn", data_dir=tmp_path, val_per_class=(4, 2))
    assert_one_line_error(exc, "test_32x32.mat", "corrupt", *SVHN_FILES, tmp_path, "--download")


def test_mat_with_wrong_shapes(tmp_path, write_svhn):
    import scipy.io

    write_svhn(tmp_path)
    x = np.zeros((28, 28, 3, 4), np.uint8)
    scipy.io.savemat(tmp_path / "train_32x32.mat", {"X": x, "y": np.ones((4, 1), np.uint8)})
    with pytest.raises(DataError) as exc:
        load_dataset("svhn", data_dir=tmp_path, val_per_class=(4, 2))
    assert_one_line_error(exc, "train_32x32.mat", "[32, 32, 3, N]", "--download")


def test_bad_options_and_limit():
    with pytest.raises(DataError) as exc:
        load_dataset("digits", val_per_class=(4, 2))
    assert_one_line_error(exc, "val_per_class", "digits")
    with pytest.raises(DataError):
        load_dataset("digits", limit=0)


# --- download through torchvision (no network here: torchvision's classes are faked) ---


def test_download_cifar10_through_torchvision(tmp_path, write_cifar10, monkeypatch):
    calls = []

    class FakeCIFAR10(torchvision.datasets.CIFAR10):
        def __init__(self, root, train=True, download=False, **kwargs):
            calls.append((root, train, download))
            write_cifar10(tmp_path)

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCIFAR10)
    ds = load_dataset("cifar10", data_dir=tmp_path, download=True)
    assert calls == [(str(tmp_path), True, True)]
    assert len(ds.train) + len(ds.val) == 300


def test_download_svhn_fetches_each_missing_split(tmp_path, write_svhn, monkeypatch):
    calls = []

    class FakeSVHN(torchvision.datasets.SVHN):
        def __init__(self, root, split="train", download=False, **kwargs):
            calls.append(split)

    monkeypatch.setattr(torchvision.datasets, "SVHN", FakeSVHN)
    write_svhn(tmp_path)
    load_dataset("svhn", data_dir=tmp_path, download=True, val_per_class=(4, 2))
    assert calls == ["train", "extra", "test"]  # the tiny files fail torchvision's md5 check


def test_failed_download_is_a_one_line_error(tmp_path, monkeypatch):
    class OfflineCIFAR100(torchvision.datasets.CIFAR100):
        def __init__(self, root, train=True, download=False, **kwargs):
            raise urllib.error.URLError("[Errno -3] Temporary failure\nin name resolution")

    monkeypatch.setattr(torchvision.datasets, "CIFAR100", OfflineCIFAR100)
    with pytest.raises(DataError) as exc:
        load_dataset("cifar100", data_dir=tmp_path, download=True)
    assert_one_line_error(exc, "download", "URLError", "train", "test", tmp_path / "cifar-100-python")


def test_available_datasets(tmp_path, write_cifar10, monkeypatch):
    from normprop_cli.data import fashion

    monkeypatch.setattr(fashion, "SYSTEM_DIR", tmp_path / "no-package")  # whatever this machine has
    present = available_datasets(tmp_path)
    assert present == {
        "cifar10": False,
        "cifar100": False,
        "svhn": False,
        "digits": True,
        "fashion-mnist": False,
        "synthetic": True,
    }
    write_cifar10(tmp_path)
    assert available_datasets(tmp_path)["cifar10"]
    package = tmp_path / "package"  # the four files where the Debian package puts them
    package.mkdir()
    for stem in fashion.FILES.values():
        fashion.write_idx(package / stem, np.zeros((1, 28, 28) if "images" in stem else (1,), dtype=np.uint8))
    monkeypatch.setattr(fashion, "SYSTEM_DIR", package)
    assert available_datasets(tmp_path)["fashion-mnist"]


# --- digits and synthetic -------------------------------------------------------------


def test_digits_is_the_1797_sklearn_images():
    ds = load_dataset("digits")
    check_split_types(ds, 10)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (1197, 300, 300)
    assert set(torch.cat([ds.train.y, ds.val.y, ds.test.y]).tolist()) == set(range(10))
    x = ds.train.x
    assert torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 0], x[:, 2])  # grey
    assert x.max() == 255 and x.min() == 0


def test_digits_split_is_seeded_and_test_is_fixed():
    a, b, c = (load_dataset("digits", split_seed=s) for s in (0, 0, 1))
    assert torch.equal(a.val.x, b.val.x) and torch.equal(a.train.y, b.train.y)
    assert a.info["val_indices_sha1"] != c.info["val_indices_sha1"]
    assert torch.equal(a.test.x, c.test.x)  # test accuracy comparable across split seeds
    assert a.info["test_indices_sha1"] == c.info["test_indices_sha1"]


def test_synthetic_is_deterministic_and_learnable():
    ds = load_dataset("synthetic")
    check_split_types(ds, 10)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (512, 128, 128)
    assert torch.equal(ds.train.x, load_dataset("synthetic").train.x)
    assert not torch.equal(ds.train.x, load_dataset("synthetic", split_seed=1).train.x)
    # a nearest-class-mean classifier fit on train separates the test images
    x = ds.train.x.flatten(1).float()
    means = torch.stack([x[ds.train.y == c].mean(0) for c in range(10)])
    pred = torch.cdist(ds.test.x.flatten(1).float(), means).argmin(1)
    assert (pred == ds.test.y).float().mean() > 0.9
    small = load_dataset("synthetic", sizes=(40, 20, 10))
    assert (len(small.train), len(small.val), len(small.test)) == (40, 20, 10)


def test_limit_keeps_a_seeded_subset_per_split():
    ds = load_dataset("digits", limit=100)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (100, 100, 100)
    assert ds.info["limit"] == 100 and ds.info["full_sizes"]["train"] == 1197
    assert torch.equal(ds.train.x, load_dataset("digits", limit=100).train.x)
    assert load_dataset("synthetic", limit=1000).info["sizes"]["train"] == 512


def test_split_and_dataset_move_to_a_device():
    ds = load_dataset("synthetic", sizes=(20, 10, 10)).to("cpu")
    assert len(ds.train) == 20 and ds.train.x.device.type == "cpu"
    with pytest.raises(ValueError):
        Split(torch.zeros(2, 3, 32, 32), torch.zeros(2, dtype=torch.int64))  # float images
