"""What every benchmark does at the end: print its targets, write JSON, set the exit status.

Only the standard library: ``train_step.py`` imports it before jax and torch.
"""

import argparse
import json
import os
from typing import Any


def positive_int(text: str) -> int:
  """An argparse type: an integer >= 1."""
  value = int(text)  # a ValueError: argparse says the value is invalid
  if value < 1:
    raise argparse.ArgumentTypeError(f'must be an integer >= 1, got {text}')
  return value


def non_negative_int(text: str) -> int:
  """An argparse type: an integer >= 0."""
  value = int(text)
  if value < 0:
    raise argparse.ArgumentTypeError(f'must be an integer >= 0, got {text}')
  return value


def json_path(text: str) -> str:
  """An argparse type: a file to write, in a folder that exists (checked before the run).

  The file is opened for appending, as the run will write it, and a file that
  did not exist is removed again: what cannot be written fails here, not after
  the run.
  """
  if not text:
    raise argparse.ArgumentTypeError('an empty path: give a file to write')
  folder = os.path.dirname(os.path.abspath(text))
  if not os.path.isdir(folder):
    raise argparse.ArgumentTypeError(f'no folder {folder} to write {text!r} into')
  if os.path.isdir(text):
    raise argparse.ArgumentTypeError(f'cannot write a file {text}: it is a folder')
  existed = os.path.exists(text)
  try:
    with open(text, 'a'):
      pass
  except OSError as e:
    raise argparse.ArgumentTypeError(f'cannot write a file {text}: {e.strerror}') from None
  if not existed:
    os.remove(text)
  return text


def add_json_argument(parser: argparse.ArgumentParser) -> None:
  """The ``--json FILE`` flag every benchmark takes, checked by :func:`json_path`."""
  parser.add_argument(
      '--json',
      type=json_path,
      default=None,
      help='also write the table and the targets to this JSON file',
  )


def print_targets(targets: dict[str, bool]) -> None:
  for target, ok in targets.items():
    print(f"{'PASS' if ok else 'FAIL'}  {target}")


def finish(targets: dict[str, bool], json_path: str | None, data: dict[str, Any]) -> int:
  """Writes ``data`` and the targets to ``json_path`` if given; 1 if a target failed, else 0."""
  if json_path:
    with open(json_path, 'w') as f:
      json.dump({**data, 'targets': targets}, f, indent=2)
  return 0 if all(targets.values()) else 1
