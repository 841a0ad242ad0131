"""Adaptive accumulation against the fixed-batch frontier: ``python -m optax_gqc.demo``.

A small byte-level transformer (Flax NNX) learns Python source code: by
default the top-level modules of the running interpreter's standard library
(``<stdlib>/*.py``, sorted by name, the first ``--corpus-bytes``), so the data
is on every machine and nothing is downloaded; ``--data FILE`` trains on your
own text. The last 10% is held out for validation.

Every arm trains on the same microbatches and differs only in when it steps
(:mod:`optax_gqc.demo.arms`); the verdict says whether an adaptive arm lands
below the fixed-batch frontier (:mod:`optax_gqc.demo.verdict`).

Writes ``table.txt``, ``results.json`` and ``curves.png`` (with ``--study``
also ``study.png``) into ``--out``. See ``docs/demo.md``.

The modules, each importing only those before it: ``data``, ``model``,
``arms``, ``train``, ``verdict``, ``plot``, ``cli`` (the command line) and
``job`` (the main job, :func:`main`).
"""

from optax_gqc.demo.job import main

__all__ = ['main']
