"""The API reference documents every public name, read from each module's ``__all__``."""

import importlib
import json
import pathlib
import re
import subprocess
import sys

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[1] / 'docs'
PUBLIC_MODULES = [
    'optax_gqc',
    'optax_gqc.gates',
    'optax_gqc.schedules',
    'optax_gqc.sampling',
    'optax_gqc.study',
    'optax_gqc.interop.torch',
    'optax_gqc.interop.torch_replay',
    'optax_gqc.interop.nnx',
]


def test_every_public_module_has_an_api_page():
  sources = '\n'.join(p.read_text() for p in sorted((DOCS / 'api').glob('*.rst')))
  documented = set(re.findall(r'^\.\. module-api:: (\S+)$', sources, re.MULTILINE))
  assert documented == set(PUBLIC_MODULES)


# The docs build runs in a subprocess: autodoc_preserve_defaults rewrites the
# default values of the functions it documents, in place, for the process.
BUILD = """
import io, json, sys, warnings
from sphinx.application import Sphinx
docs, out = sys.argv[1:]
with warnings.catch_warnings():  # Sphinx's deprecation notices to its extensions
  warnings.simplefilter('ignore')
  app = Sphinx(docs, docs, out + '/dummy', out + '/doctrees', 'dummy', status=None,
               warning=io.StringIO(), freshenv=True)
  app.build()
print(json.dumps(sorted(app.env.get_domain('py').objects)))
"""


@pytest.fixture(scope='module')
def documented_objects(tmp_path_factory):
  """The Python objects the docs describe, from a build that writes nothing."""
  # What the docs build needs: the docs extra, flax for the page of interop.nnx, and
  # torch for the pages of optax_gqc.interop.
  for module in ('sphinx', 'myst_parser', 'flax', 'torch'):
    pytest.importorskip(module)
  out = tmp_path_factory.mktemp('docs')
  result = subprocess.run(
      [sys.executable, '-c', BUILD, str(DOCS), str(out)],
      capture_output=True,
      text=True,
      timeout=600,
      check=True,
  )
  return set(json.loads(result.stdout.splitlines()[-1]))


@pytest.mark.slow
@pytest.mark.parametrize('modname', PUBLIC_MODULES)
def test_every_name_in_all_is_in_the_api_reference(documented_objects, modname):
  module = importlib.import_module(modname)
  missing = [name for name in module.__all__ if f'{modname}.{name}' not in documented_objects]
  assert not missing, f'{modname}: not in the API reference: {missing}'


def test_every_field_of_a_public_named_tuple_has_its_description():
  # A field described by a comment on the lines above it (and one with no comment) had an
  # empty entry in the API reference: 20 of them, AccumulateState.noise among them.
  pytest.importorskip('sphinx')
  sys.path.insert(0, str(DOCS / '_ext'))
  try:
    import gqc_sphinx  # noqa: PLC0415
  finally:
    sys.path.remove(str(DOCS / '_ext'))
  empty = []
  for modname in PUBLIC_MODULES:
    try:
      module = importlib.import_module(modname)
    except ImportError:  # flax or torch absent: their pages are not built either
      continue
    for name in module.__all__:
      cls = getattr(module, name)
      for i, field in enumerate(getattr(cls, '_fields', ()) if isinstance(cls, type) else ()):
        if field not in vars(cls):  # inherited (Optax's), not rendered here
          continue
        lines = [f'Alias for field number {i}']
        path = f'{cls.__module__}.{cls.__qualname__}.{field}'
        gqc_sphinx._field_comment(None, 'attribute', path, None, None, lines)
        if not lines or not lines[0].strip():
          empty.append(f'{name}.{field}')
  assert not empty, empty
