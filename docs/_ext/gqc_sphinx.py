"""Sphinx extensions for the optax_gqc docs: pages driven by the code, not copied from it.

- ``.. module-api:: MODULE`` is an autosummary table of ``MODULE.__all__``
  (submodules listed apart), then the documentation of each of those names, so
  a name added to ``__all__`` shows up without editing the docs.
- Signatures say ``optax.ScalarOrSchedule`` rather than the union it stands for.
- The fields of a ``NamedTuple`` are documented from their trailing comments
  (``num_draws: jax.Array  # int32: ...``) rather than "Alias for field number".
"""

import functools
import importlib
import inspect
import re
import sys

from sphinx.util.docutils import SphinxDirective


def public_names(modname: str) -> tuple[list[str], list[str]]:
  """``MODULE.__all__`` split into (submodules, other names), in order."""
  module = importlib.import_module(modname)
  submodules, names = [], []
  for name in module.__all__:
    (submodules if inspect.ismodule(getattr(module, name)) else names).append(name)
  return submodules, names


class ModuleApi(SphinxDirective):
  """A summary table of ``MODULE.__all__``, then each name's documentation."""

  required_arguments = 1

  def run(self):
    modname = self.arguments[0]
    module = importlib.import_module(modname)
    submodules, names = public_names(modname)
    lines = [f'.. currentmodule:: {modname}', '', '.. autosummary::', '']
    lines += [f'   {name}' for name in names]
    if submodules:
      links = ', '.join(f':mod:`{modname}.{name}`' for name in submodules)
      lines += ['', f'Submodules: {links}.']
    for name in names:
      obj = getattr(module, name)
      kind = 'class' if inspect.isclass(obj) else 'function' if callable(obj) else 'data'
      lines += ['', f'.. auto{kind}:: {name}']
    return self.parse_text_to_nodes('\n'.join(lines))


_FIELD_ALIAS = re.compile(r'Alias for field number \d+')


def _field_comment(app, what, name, obj, options, lines):
  if what != 'attribute' or not any(_FIELD_ALIAS.fullmatch(line) for line in lines):
    return
  modname, _, rest = name.rpartition('.')
  clsname = ''
  while modname and modname not in sys.modules:  # name is module.Class.field
    modname, _, part = modname.rpartition('.')
    clsname = f'{part}.{clsname}' if clsname else part
  try:
    cls = getattr(sys.modules[modname], clsname)
    source = inspect.getsource(cls)
  except (AttributeError, KeyError, OSError, TypeError):
    return
  found = re.search(rf'^\s+{re.escape(rest)}\s*:[^#\n]*#\s*(.+)$', source, re.MULTILINE)
  if found:
    text = found.group(1)
  else:  # a comment block on the lines just above the field
    above = re.search(rf'((?:^[ \t]+#.*\n)+)[ \t]+{re.escape(rest)}\s*:', source, re.MULTILINE)
    text = (
        ' '.join(re.sub(r'^\s*#\s?', '', c) for c in above.group(1).splitlines()) if above else ''
    )
  # A comment is plain text, not reStructuredText: |G|^2 is no substitution.
  lines[:] = [re.sub(r'([\\`*_|<>\[\]])', r'\\\1', text)] if text else []


@functools.cache
def _type_aliases() -> list[tuple[str, str]]:
  """(the union as autodoc writes it, its Optax name), longest first."""
  import optax
  from sphinx.util.typing import stringify_annotation

  modes = ('smart', 'fully-qualified-except-typing', 'fully-qualified')
  return [
      (stringify_annotation(annotation, mode), alias)
      for annotation, alias in (
          (optax.ScalarOrSchedule, 'optax.ScalarOrSchedule'),
          (optax.Schedule, 'optax.Schedule'),
      )
      for mode in modes
  ]


def _short_signature(app, what, name, obj, options, signature, return_annotation):
  def short(text):
    for union, alias in _type_aliases():
      text = text.replace(union, alias) if text else text
    return text

  return short(signature), short(return_annotation)


def setup(app):
  app.add_directive('module-api', ModuleApi)
  app.connect('autodoc-process-docstring', _field_comment)
  app.connect('autodoc-process-signature', _short_signature)
  return {'parallel_read_safe': True, 'parallel_write_safe': True}
