"""The parity suite runs the PyTorch references beside optax_gqc: all of it is slow."""

import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
  for item in items:
    if HERE in pathlib.Path(item.path).resolve().parents:
      item.add_marker(pytest.mark.slow)


def pytest_ignore_collect(collection_path, config):
  # Every test here is slow (above): the fast tier (-m 'not slow') skips these
  # modules rather than import torch and the references to deselect them all.
  if config.getoption('markexpr') == 'not slow' and collection_path.name != 'conftest.py':
    return True
  return None
