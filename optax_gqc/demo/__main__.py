"""``python -m optax_gqc.demo``: the main job."""

import os
import sys

from optax_gqc.demo.job import main

if __name__ == '__main__':
  try:
    main()
  except SystemExit as e:
    if e.code != 130:
      raise
    # Ctrl-C: XLA may still be compiling in a thread of its own, and tearing the
    # interpreter down under it crashes (exit 139). Leave at once, output flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)
