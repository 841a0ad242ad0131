"""The API reference documents every public name, read from each module's ``__all__``."""

import importlib
import io
import pathlib
import re
import warnings

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[1] / 'docs'
PUBLIC_MODULES = [
    'optax_gqc',
    'optax_gqc.gates',
    'optax_gqc.schedules',
    'optax_gqc.sampling',
    'optax_gqc.interop.torch',
    'optax_gqc.interop.torch_replay',
    'optax_gqc.interop.nnx',
]


def test_every_public_module_has_an_api_page():
  sources = '\n'.join(p.read_text() for p in sorted((DOCS / 'api').glob('*.rst')))
  documented = set(re.findall(r'^\.\. module-api:: (\S+)$', sources, re.MULTILINE))
  assert documented == set(PUBLIC_MODULES)


@pytest.fixture(scope='module')
def documented_objects(tmp_path_factory):
  """The Python objects the docs describe, from a build that writes nothing."""
  # What the docs build needs: the docs extra, flax for the demo's --help, and
  # torch for the pages of optax_gqc.interop.
  for module in ('sphinx', 'myst_parser', 'flax', 'torch'):
    pytest.importorskip(module)
  from sphinx.application import Sphinx

  out = tmp_path_factory.mktemp('docs')
  with warnings.catch_warnings():  # Sphinx's deprecation notices to its extensions
    warnings.simplefilter('ignore')
    app = Sphinx(
        str(DOCS),
        str(DOCS),
        str(out / 'dummy'),
        str(out / 'doctrees'),
        'dummy',
        status=None,
        warning=io.StringIO(),
        freshenv=True,
    )
    app.build()
  return set(app.env.get_domain('py').objects)


@pytest.mark.slow
@pytest.mark.parametrize('modname', PUBLIC_MODULES)
def test_every_name_in_all_is_in_the_api_reference(documented_objects, modname):
  module = importlib.import_module(modname)
  missing = [name for name in module.__all__ if f'{modname}.{name}' not in documented_objects]
  assert not missing, f'{modname}: not in the API reference: {missing}'
