"""The package installs with only what it imports, and says its version once."""

import pathlib
import re
import subprocess
import sys

import pytest

import optax_gqc

ROOT = pathlib.Path(__file__).resolve().parents[1]


def pyproject() -> dict:
  tomllib = pytest.importorskip('tomllib')  # Python 3.11+
  return tomllib.loads((ROOT / 'pyproject.toml').read_text())


def name_of(requirement: str) -> str:
  return re.match(r'[A-Za-z0-9_.-]+', requirement).group(0).lower()


def test_core_dependencies_are_what_the_library_imports():
  deps = pyproject()['project']['dependencies']
  assert sorted(name_of(d) for d in deps) == ['jax', 'jaxlib', 'numpy', 'optax']


def test_torch_is_only_ever_pinned_exactly():
  # A bare or open-ended torch requirement pulls several GB of CUDA wheels.
  extras = pyproject()['project']['optional-dependencies']
  torch_reqs = [r for reqs in extras.values() for r in reqs if name_of(r) == 'torch']
  assert torch_reqs == ['torch==2.13.0']


def test_version_is_written_once():
  project = pyproject()['project']
  assert 'version' not in project and project['dynamic'] == ['version']
  assert pyproject()['tool']['setuptools']['dynamic']['version'] == {
      'attr': 'optax_gqc.__version__'
  }
  assert re.fullmatch(r'\d+\.\d+\.\d+', optax_gqc.__version__)


def test_py_typed_is_shipped():
  assert (ROOT / 'optax_gqc' / 'py.typed').is_file()
  assert 'py.typed' in pyproject()['tool']['setuptools']['package-data']['optax_gqc']


@pytest.mark.slow
def test_importing_the_library_imports_neither_flax_nor_torch():
  code = (
      'import sys, optax_gqc, optax_gqc.interop; '
      "assert 'flax' not in sys.modules and 'torch' not in sys.modules, "
      "sorted(m for m in sys.modules if m.split('.')[0] in ('flax', 'torch'))"
  )
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
