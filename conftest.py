"""Configuration for the whole test run."""

import importlib.util


def _missing(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is None
  except (ImportError, ValueError):  # e.g. sys.modules['torch'] is None
    return True


def pytest_configure(config):
  # The PyTorch and Flax bridges raise ImportError on import without their
  # library, which would fail doctest collection of optax_gqc/. --ignore holds
  # for the whole run.
  interop = config.rootpath / 'optax_gqc' / 'interop'
  ignore = []
  if _missing('torch'):
    ignore += [str(interop / 'torch.py'), str(interop / 'torch_replay.py')]
  if _missing('flax'):
    ignore += [str(interop / 'nnx.py')]
  config.option.ignore = [*(config.option.ignore or []), *ignore]
