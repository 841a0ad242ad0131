"""The notebooks are committed without outputs, run headless, and pass their own checks.

Each notebook ends with a cell of ``assert``s on its results (the noise-scale estimate near
the truth, SGD-SaI's state half of AdamW's, GNTS's counters consistent), so a run that
finishes is a run whose numbers held. The tests run them in quick mode, in memory, in a
temporary directory: nothing is written back.
"""

import importlib
import pathlib

import pytest

from tests import processes

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / 'notebooks'
NAMES = ['01_quickstart_gnts', '02_sgd_sai', '03_noise_scale']


def read(name: str):
  return nbformat().read(NOTEBOOKS / f'{name}.ipynb', as_version=4)


def nbformat():
  """The nbformat module, imported when a test needs it: its import takes seconds at collection."""
  return importlib.import_module('nbformat')


def test_the_notebooks_are_all_here():
  assert sorted(p.stem for p in NOTEBOOKS.glob('*.ipynb')) == NAMES


@pytest.mark.parametrize('name', NAMES)
def test_notebook_is_committed_without_outputs(name):
  nb = read(name)
  nbformat().validate(nb)
  assert nb.metadata.kernelspec.name == 'python3'
  code = [cell for cell in nb.cells if cell.cell_type == 'code']
  assert code and nb.cells[0].cell_type == 'markdown'
  for cell in code:
    assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]
  # The first code cell picks the settings: small ones under this variable.
  assert "os.environ.get('OPTAX_GQC_NOTEBOOK_QUICK') == '1'" in code[0].source


@pytest.mark.parametrize('name', NAMES)
def test_notebook_runs_and_passes_its_checks(name, monkeypatch, tmp_path):
  monkeypatch.setenv('OPTAX_GQC_NOTEBOOK_QUICK', '1')
  # The kernel imports this checkout's package, not another installed copy.
  monkeypatch.setenv('PYTHONPATH', processes.pythonpath())
  monkeypatch.delenv('MPLBACKEND', raising=False)  # the kernel's inline backend draws the plots
  nb = read(name)
  # A failing cell, including a failing assert in the checks, raises CellExecutionError.
  importlib.import_module('nbclient').NotebookClient(
      nb, kernel_name='python3', timeout=300, resources={'metadata': {'path': str(tmp_path)}}
  ).execute()
  outputs = [out for cell in nb.cells if cell.cell_type == 'code' for out in cell.outputs]
  assert not [out for out in outputs if out.output_type == 'error']
  figures = [out for out in outputs if 'image/png' in out.get('data', {})]
  assert len(figures) >= 2
  last = [cell for cell in nb.cells if cell.cell_type == 'code'][-1]
  assert 'assert ' in last.source
  assert any(out.output_type == 'stream' and out.text.strip() for out in last.outputs)
