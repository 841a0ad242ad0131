"""What every benchmark does at the end: print its targets, write JSON, set the exit status.

Only the standard library: ``train_step.py`` imports it before jax and torch.
"""

import json
from typing import Any


def print_targets(targets: dict[str, bool]) -> None:
  for target, ok in targets.items():
    print(f"{'PASS' if ok else 'FAIL'}  {target}")


def finish(targets: dict[str, bool], json_path: str | None, data: dict[str, Any]) -> int:
  """Writes ``data`` and the targets to ``json_path`` if given; 1 if a target failed, else 0."""
  if json_path:
    with open(json_path, 'w') as f:
      json.dump({**data, 'targets': targets}, f, indent=2)
  return 0 if all(targets.values()) else 1
