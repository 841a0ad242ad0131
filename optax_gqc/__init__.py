"""optax_gqc: gradient-quality control as Optax transformations."""
