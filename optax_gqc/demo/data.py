"""The demo's text: the standard library's sources or a user's file, cut into microbatches."""

import sysconfig
from pathlib import Path

import numpy as np


def stdlib_corpus(max_bytes: int) -> tuple[bytes, list[str]]:
  """The running interpreter's top-level stdlib modules, sorted by name, capped."""
  root = Path(sysconfig.get_paths()['stdlib'])
  chunks, names, size = [], [], 0
  for path in sorted(root.glob('*.py')):
    data = path.read_bytes()
    chunks.append(data)
    names.append(path.name)
    size += len(data)
    if size >= max_bytes:
      break
  return b''.join(chunks)[:max_bytes], names


def sample_batches(tokens: np.ndarray, count: int, size: int, context: int, seed: int):
  """``count`` microbatches of ``size`` windows of ``context + 1`` bytes."""
  rng = np.random.default_rng(seed)
  starts = rng.integers(0, len(tokens) - context - 1, size=(count, size))
  return tokens[starts[..., None] + np.arange(context + 1)]


def load_corpus(path: str | None, max_bytes: int) -> tuple[np.ndarray, list[str]]:
  """The text of the file ``path`` (all of it), else :func:`stdlib_corpus`, as int32 bytes.

  Returns:
    The bytes, and the files they come from.
  """
  if path:
    text, source = Path(path).read_bytes(), [path]
  else:
    text, source = stdlib_corpus(max_bytes)
  return np.frombuffer(text, np.uint8).astype(np.int32), source
