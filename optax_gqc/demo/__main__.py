"""``python -m optax_gqc.demo``: the main job."""

from optax_gqc.demo.job import main

if __name__ == '__main__':
  main()
