"""fashion-mnist: the IDX reader on files the test writes, the loader's split and padding, the search
order (data dir before the Debian package), the one-line error when the files are nowhere, and the
training subset (dataset.train_limit). The suite writes its own small IDX files, so it passes on a
machine without the package."""

import gzip

import numpy as np
import pytest
import torch

from normprop_cli.data import DataError, fashion, load_dataset
from normprop_cli.data.fashion import FILES, read_idx, write_idx


@pytest.fixture
def no_system_copy(monkeypatch, tmp_path):
    """Pretend the Debian package is not installed (whatever this machine has)."""
    monkeypatch.setattr(fashion, "SYSTEM_DIR", tmp_path / "no-such-package-dir")


def write_fashion(directory, n_train=120, n_test=30, gz=True, seed=0):
    """The four IDX files of a tiny Fashion-MNIST; returns (train x, train y, test x, test y)."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    parts = {
        "train_images": rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, size=n_train).astype(np.uint8),
        "test_images": rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, size=n_test).astype(np.uint8),
    }
    for part, array in parts.items():
        write_idx(directory / (FILES[part] + (".gz" if gz else "")), array)
    return parts["train_images"], parts["train_labels"], parts["test_images"], parts["test_labels"]


@pytest.mark.parametrize("gz", [False, True])
def test_idx_reader_reads_the_header_and_the_values(tmp_path, gz):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / ("x-idx3-ubyte" + (".gz" if gz else ""))
    write_idx(path, images)
    raw = gzip.open(path).read() if gz else path.read_bytes()
    assert raw[:4] == bytes([0, 0, 0x08, 3])  # magic: two zero bytes, uint8, 3 dimensions
    assert int.from_bytes(raw[4:8], "big") == 2 and int.from_bytes(raw[12:16], "big") == 4
    np.testing.assert_array_equal(read_idx(path), images)


def test_idx_reader_refuses_a_file_that_is_not_one(tmp_path):
    bad = tmp_path / "bad-idx1-ubyte"
    bad.write_bytes(b"\x01\x02\x08\x01" + (5).to_bytes(4, "big") + b"abc")
    with pytest.raises(ValueError, match="magic"):
        read_idx(bad)
    short = tmp_path / "short-idx1-ubyte"
    short.write_bytes(bytes([0, 0, 0x08, 1]) + (5).to_bytes(4, "big") + b"abc")  # 3 bytes for 5 labels
    with pytest.raises(ValueError, match="expected 5"):
        read_idx(short)


@pytest.mark.parametrize("gz", [False, True])
def test_loader_splits_pads_and_keeps_every_test_image(tmp_path, no_system_copy, gz):
    x, y, tx, ty = write_fashion(tmp_path / "FashionMNIST" / "raw", gz=gz)
    ds = load_dataset("fashion-mnist", data_dir=tmp_path, split_seed=3)
    assert ds.in_channels == 1 and ds.num_classes == 10
    assert ds.train.x.shape[1:] == (1, 32, 32) and ds.train.x.dtype == torch.uint8
    assert len(ds.val) == 120 // 12 and len(ds.train) == 120 - len(ds.val)
    assert len(ds.test) == 30
    # the test split is the test file, in order; zero padding of 2 pixels around each 28x28 image
    np.testing.assert_array_equal(ds.test.x[:, 0, 2:30, 2:30].numpy(), tx)
    assert ds.test.x[:, :, :2].sum() == 0 and ds.test.x[:, :, :, 30:].sum() == 0
    np.testing.assert_array_equal(ds.test.y.numpy(), ty)
    # train and val are disjoint and together the training file
    seen = torch.cat([ds.train.x, ds.val.x])[:, 0, 2:30, 2:30].reshape(120, -1)
    assert sorted(map(bytes, seen.numpy())) == sorted(map(bytes, x.reshape(120, -1)))
    # the split is fixed by split_seed
    again = load_dataset("fashion-mnist", data_dir=tmp_path, split_seed=3)
    assert torch.equal(again.val.x, ds.val.x)
    other = load_dataset("fashion-mnist", data_dir=tmp_path, split_seed=4)
    assert not torch.equal(other.val.x, ds.val.x)


def test_the_data_dir_wins_over_the_package_directory(tmp_path, monkeypatch):
    write_fashion(tmp_path / "package", n_train=60, seed=1)
    monkeypatch.setattr(fashion, "SYSTEM_DIR", tmp_path / "package")
    assert len(load_dataset("fashion-mnist", data_dir=tmp_path / "empty").test) == 30  # the package's
    write_fashion(tmp_path / "mine" / "FashionMNIST" / "raw", n_train=240, n_test=40, seed=2)
    ds = load_dataset("fashion-mnist", data_dir=tmp_path / "mine")
    assert len(ds.test) == 40 and ds.info["source_dir"].endswith("raw")


def test_missing_files_name_the_package_and_download(tmp_path, no_system_copy):
    with pytest.raises(DataError) as info:
        load_dataset("fashion-mnist", data_dir=tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert "apt-get install dataset-fashion-mnist" in message and "--download" in message
    assert "t10k-images-idx3-ubyte" in message


def test_a_corrupt_file_is_a_one_line_error(tmp_path, no_system_copy):
    raw = tmp_path / "FashionMNIST" / "raw"
    write_fashion(raw, gz=False)
    (raw / FILES["test_labels"]).write_bytes(b"not an idx file")
    with pytest.raises(DataError, match="corrupt.*t10k-labels"):
        load_dataset("fashion-mnist", data_dir=tmp_path)


def test_the_command_exits_2_without_the_files(cli, tmp_path, no_system_copy):
    result = cli("run", "table1", "--dataset", "fashion-mnist", "--data-dir", tmp_path / "nowhere",
                 "--results-dir", cli.results, "--preset", "smoke")  # fmt: skip
    assert result.exit_code == 2
    assert "apt-get install dataset-fashion-mnist" in result.output
    assert not cli.results.exists() or not any(cli.results.rglob("*.csv"))


def test_train_limit_keeps_a_seeded_subset_of_the_training_images_only(tmp_path, no_system_copy):
    write_fashion(tmp_path / "FashionMNIST" / "raw", n_train=240, n_test=30)
    full = load_dataset("fashion-mnist", data_dir=tmp_path)
    part = load_dataset("fashion-mnist", data_dir=tmp_path, train_limit=50)
    assert len(part.train) == 50 and len(part.val) == len(full.val) and len(part.test) == len(full.test)
    assert part.info["sizes"]["train"] == 50 and part.info["full_train"] == len(full.train)
    rows = {bytes(r) for r in full.train.x.reshape(len(full.train), -1).numpy()}
    assert all(bytes(r) in rows for r in part.train.x.reshape(50, -1).numpy())
    assert torch.equal(load_dataset("fashion-mnist", data_dir=tmp_path, train_limit=50).train.x, part.train.x)
    with pytest.raises(DataError, match="train_limit"):
        load_dataset("fashion-mnist", data_dir=tmp_path, train_limit=0)
