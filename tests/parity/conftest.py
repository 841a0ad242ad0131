"""The parity suite runs the PyTorch references beside optax_gqc: all of it is slow."""

import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
  for item in items:
    if HERE in pathlib.Path(item.path).resolve().parents:
      item.add_marker(pytest.mark.slow)
