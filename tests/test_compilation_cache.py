"""What ``conftest.py`` sets for the whole run: the CPU, and compiled programs kept between runs."""

import os

import jax
import pytest


def test_the_suite_keeps_its_compiled_programs_in_pytests_cache(pytestconfig):
  cache = getattr(pytestconfig, 'cache', None)
  if cache is None:
    pytest.skip('run with -p no:cacheprovider: no cache folder')
  folder = cache.mkdir('jax_compilation_cache')
  if os.environ['JAX_COMPILATION_CACHE_DIR'] != str(folder):
    pytest.skip('JAX_COMPILATION_CACHE_DIR was set before the run')
  assert jax.config.jax_compilation_cache_dir == str(folder)
  # The subprocesses the suite starts read the same settings from the environment.
  assert float(os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS']) == 0.0
  for old in folder.glob('jit_kept_by_the_suite-*'):
    old.unlink()

  @jax.jit
  def kept_by_the_suite(x):
    return x * 2.0 + 1.0

  assert float(kept_by_the_suite(1.0)) == 3.0
  # Written although it compiles in milliseconds, far under JAX's default of 1 s.
  assert list(folder.glob('jit_kept_by_the_suite-*-cache'))


def test_the_suite_runs_on_the_cpu_unless_jax_platforms_says_otherwise():
  # conftest.py sets JAX_PLATFORMS=cpu where the run did not set it.
  assert 'JAX_PLATFORMS' in os.environ
  if os.environ['JAX_PLATFORMS'] != 'cpu':
    pytest.skip(f"JAX_PLATFORMS={os.environ['JAX_PLATFORMS']!r} was set for the run")
  assert jax.default_backend() == 'cpu'
  assert {d.platform for d in jax.devices()} == {'cpu'}
