"""Bridges between optax_gqc and other frameworks.

Each bridge is a submodule with its own optional dependency, imported only when
asked for: ``optax_gqc.interop.torch`` needs PyTorch
(``pip install "optax-gqc[torch]"``), ``optax_gqc.interop.nnx`` (the fused
step for Flax NNX) needs Flax. Importing this package imports none of them.
"""
