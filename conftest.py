"""Configuration for the whole test run."""

import importlib.util


def _torch_missing() -> bool:
  try:
    return importlib.util.find_spec('torch') is None
  except (ImportError, ValueError):  # e.g. sys.modules['torch'] is None
    return True


def pytest_configure(config):
  # The PyTorch bridge raises ImportError on import without torch, which would
  # fail doctest collection of optax_gqc/. --ignore holds for the whole run.
  if _torch_missing():
    config.option.ignore = [
        *(config.option.ignore or []),
        str(config.rootpath / 'optax_gqc' / 'interop' / 'torch.py'),
        str(config.rootpath / 'optax_gqc' / 'interop' / 'torch_replay.py'),
    ]
