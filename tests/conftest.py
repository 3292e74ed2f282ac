"""Fixtures shared by the test files: the bundled reference models and Fashion-MNIST's splits.

Loaded once per session. Imports of the encoder side stay inside the fixtures: the decoder-only
environment of .ci/run collects these tests too, with nothing but the base install.
"""
import os
from pathlib import Path

import pytest

# the reference models and data sets of the checkout, also where pydsz is installed from a wheel
# (which carries none): CI's decoder-only environments run these tests against such an install
os.environ.setdefault("DSZ_DATA", str(Path(__file__).resolve().parents[1] / "pydsz" / "data"))

from pydsz.model.data import bundled, load_npz  # noqa: E402


@pytest.fixture(scope="session")
def lenet300() -> bytes:
    """LeNet-300-100 as .tflite bytes."""
    return bundled("lenet300.tflite").read_bytes()


@pytest.fixture(scope="session")
def lenet5() -> bytes:
    """LeNet-5 as .tflite bytes."""
    return bundled("lenet5.tflite").read_bytes()


@pytest.fixture(scope="session")
def lenet300_model(lenet300):
    """LeNet-300-100 parsed (pydsz.model.graph.TFLiteModel)."""
    from pydsz.model.graph import TFLiteModel

    return TFLiteModel(lenet300)


@pytest.fixture(scope="session")
def lenet5_model(lenet5):
    from pydsz.model.graph import TFLiteModel

    return TFLiteModel(lenet5)


@pytest.fixture(scope="session")
def val():
    """The first 1,000 samples of the bundled validation split (uint8 images, labels)."""
    x, y = load_npz(bundled("fmnist_val.npz"))
    return x[:1000], y[:1000]


@pytest.fixture(scope="session")
def test_set():
    """The whole bundled test split (10,000 samples)."""
    return load_npz(bundled("fmnist_test.npz"))
