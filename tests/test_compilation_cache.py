"""What ``conftest.py`` sets for the run: the CPU, compiled programs kept, XLA:CPU-only tests."""

import importlib.util
import os
import pathlib

import jax
import pytest

# The root conftest.py, as a module of its own: tests/parity has a conftest too.
_spec = importlib.util.spec_from_file_location(
    'root_conftest', pathlib.Path(__file__).parents[1] / 'conftest.py'
)
conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conftest)


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


@pytest.mark.parametrize(
    ('platforms', 'flags', 'expected'),
    [
        ('cuda', '', '--xla_gpu_deterministic_ops=true'),
        ('cuda', '--xla_dump_to=d', '--xla_dump_to=d --xla_gpu_deterministic_ops=true'),
        ('cuda', '--xla_gpu_deterministic_ops=false', '--xla_gpu_deterministic_ops=false'),
        ('cpu', '--xla_dump_to=d', '--xla_dump_to=d'),
    ],
)
def test_off_the_cpu_the_suite_asks_xla_for_sums_in_a_fixed_order(
    monkeypatch, platforms, flags, expected
):
  monkeypatch.setenv('JAX_PLATFORMS', platforms)
  monkeypatch.setenv('XLA_FLAGS', flags)
  conftest._deterministic_sums()
  assert os.environ['XLA_FLAGS'] == expected


class _Item:
  """What conftest's hook reads of a collected test, and the markers it adds."""

  def __init__(self, name, marker=None):
    self.name, self.marker, self.added = name, marker, []

  def get_closest_marker(self, name):
    return self.marker if name == 'cpu_only' else None

  def add_marker(self, marker):
    self.added.append(marker)


@pytest.mark.parametrize('backend', ['cpu', 'gpu'])
def test_off_the_cpu_the_tests_of_what_only_xla_cpu_does_are_skipped(monkeypatch, backend):
  monkeypatch.setattr(jax, 'default_backend', lambda: backend)
  marked = _Item('test_fusions', pytest.mark.cpu_only('counts fusions').mark)
  doctest = _Item('optax_gqc.interop.torch.to_torch')
  other = _Item('test_anything_else')
  conftest.pytest_collection_modifyitems(None, [marked, doctest, other])
  assert other.added == []
  if backend == 'cpu':
    assert marked.added == doctest.added == []
  else:
    skips = [item.added[0].mark for item in (marked, doctest)]
    assert [m.name for m in skips] == ['skip', 'skip']
    assert skips[0].kwargs['reason'] == 'XLA:CPU only (gpu here): counts fusions'
    assert skips[1].kwargs['reason'].endswith(conftest.CPU_ONLY_DOCTESTS[doctest.name])


@pytest.mark.parametrize('name', sorted(conftest.CPU_ONLY_DOCTESTS))
def test_each_cpu_only_doctest_is_one_of_the_package(name):
  module, _, function = name.rpartition('.')
  if module.startswith('optax_gqc.interop.torch'):
    pytest.importorskip('torch')
  assert '>>> ' in importlib.import_module(module).__dict__[function].__doc__
