"""Configuration for the whole test run."""

import importlib.util
import os
import shutil

import pytest

# A run that finds more than this in the cache folder empties it first. (JAX's
# own size limit would scan the whole folder, under a file lock, at each write.)
_CACHE_LIMIT_BYTES = 2**30


def _missing(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is None
  except (ImportError, ValueError):  # e.g. sys.modules['torch'] is None
    return True


def _on_the_cpu() -> None:
  """Runs the suite on the CPU, as CI does, unless ``JAX_PLATFORMS`` is set.

  Its bitwise expectations and compiled-program counts are the CPU's
  (CONTRIBUTING.md, "On a GPU"), so a machine with a GPU runs it on its CPU
  too; ``JAX_PLATFORMS=cuda,cpu python -m pytest`` runs it on the GPU. The
  subprocesses the suite starts inherit the setting through the environment.
  """
  if 'JAX_PLATFORMS' in os.environ:
    return
  os.environ['JAX_PLATFORMS'] = 'cpu'
  import jax

  jax.config.update('jax_platforms', 'cpu')  # should a plugin have imported jax already


def _deterministic_sums() -> None:
  """Off the CPU, asks XLA for sums in a fixed order (``--xla_gpu_deterministic_ops``).

  The demo's and the study's tests run a program twice and compare the results
  bit for bit; XLA:GPU may otherwise sum with atomic adds (an embedding's
  gradient is a scatter-add), in an order that varies. A value of the flag
  already in ``XLA_FLAGS`` is left as it is.
  """
  flags = os.environ.get('XLA_FLAGS', '')
  if os.environ['JAX_PLATFORMS'] == 'cpu' or '--xla_gpu_deterministic_ops' in flags:
    return
  os.environ['XLA_FLAGS'] = f'{flags} --xla_gpu_deterministic_ops=true'.strip()


# Doctests whose output is XLA:CPU's; tests mark themselves @pytest.mark.cpu_only(reason).
CPU_ONLY_DOCTESTS = {
    'optax_gqc._noise_scale.noise_scale_estimates': "it prints XLA:CPU's exact divisions",
    'optax_gqc.interop.torch.to_torch': 'it prints a tensor on the CPU',
    'optax_gqc.interop.torch_replay.replay': "it prints XLA:CPU's parameters to the last digit",
}


def cpu_only_reason(item) -> str | None:
  """Why ``item`` checks what only XLA:CPU does (its programs, its rounding), or None."""
  marker = item.get_closest_marker('cpu_only')
  return marker.args[0] if marker else CPU_ONLY_DOCTESTS.get(item.name)


def _keep_compiled_programs(config) -> None:
  """Keeps the suite's compiled programs between runs, in pytest's cache folder.

  Most of the suite's time is XLA compiling, and most of its programs are the
  same from one run to the next, so a second run reads them back. The folder
  is ``.pytest_cache/d/jax_compilation_cache``: ``pytest --cache-clear`` starts
  cold, ``-p no:cacheprovider`` turns the cache off, and a
  ``JAX_COMPILATION_CACHE_DIR`` already set is left as it is. The subprocesses
  the suite starts inherit the settings through the environment.
  """
  if 'JAX_COMPILATION_CACHE_DIR' in os.environ or getattr(config, 'cache', None) is None:
    return
  import jax

  folder = config.cache.mkdir('jax_compilation_cache')
  if 'PYTEST_XDIST_WORKER' not in os.environ:  # once per run, before any worker starts
    if sum(f.stat().st_size for f in folder.iterdir()) > _CACHE_LIMIT_BYTES:
      shutil.rmtree(folder)
      folder.mkdir()
  flags = {
      'jax_compilation_cache_dir': str(folder),
      'jax_persistent_cache_min_compile_time_secs': 0.0,  # every program, however quick
      'jax_persistent_cache_min_entry_size_bytes': -1,
  }
  for name, value in flags.items():
    os.environ[name.upper()] = str(value)
    jax.config.update(name, value)


def pytest_configure(config):
  _on_the_cpu()
  _deterministic_sums()
  _keep_compiled_programs(config)
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


def pytest_collection_modifyitems(config, items):
  """Off the CPU, skips the tests of what only XLA:CPU does, each with its reason."""
  marked = [(item, reason) for item in items if (reason := cpu_only_reason(item))]
  if not marked:  # e.g. pytest-xdist's controller, which collects nothing: jax stays asleep
    return
  import jax

  backend = jax.default_backend()
  if backend != 'cpu':
    for item, reason in marked:
      item.add_marker(pytest.mark.skip(reason=f'XLA:CPU only ({backend} here): {reason}'))
