"""Sphinx configuration: the API reference from the docstrings, and the longer pages."""

import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / '_ext'))
sys.path.insert(0, str(DOCS.parent))

import optax_gqc  # noqa: E402

project = 'optax_gqc'
author = 'The optax_gqc authors'
copyright = '2026, the optax_gqc authors'
release = optax_gqc.__version__
version = release

extensions = [
    'sphinx.ext.autodoc',
    'sphinx.ext.autosummary',
    'sphinx.ext.napoleon',
    'sphinx.ext.mathjax',
    'sphinx.ext.viewcode',
    'myst_parser',
    'gqc_sphinx',
]

source_suffix = {'.rst': 'restructuredtext', '.md': 'markdown'}
exclude_patterns = ['_build', '_ext', 'study/*.md']  # study/: the suite's data, not pages
root_doc = 'index'

# module-api (docs/_ext) documents each name in a module's __all__; a class shows its members.
autodoc_default_options = {'members': True, 'undoc-members': True, 'member-order': 'bysource'}
autodoc_typehints = 'signature'
autodoc_typehints_format = 'short'
autodoc_preserve_defaults = True
autosummary_generate = False

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True
napoleon_attr_annotations = False

myst_enable_extensions = ['dollarmath', 'colon_fence']
myst_heading_anchors = 3

html_theme = 'alabaster'
html_title = f'optax_gqc {release}'
html_static_path = []
