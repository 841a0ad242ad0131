"""The demo's text: the corpus it reads."""

import numpy as np
import pytest

from optax_gqc.demo import data

pytestmark = pytest.mark.slow


def test_load_corpus_reads_a_users_file_whole_or_the_stdlib_capped(tmp_path):
  text = tmp_path / 'text.txt'
  text.write_bytes(b'abc' * 10)
  tokens, source = data.load_corpus(str(text), 5)
  assert source == [str(text)] and tokens.dtype == np.int32
  assert tokens.tolist() == list(b'abc' * 10)
  tokens, source = data.load_corpus(None, 5000)
  assert len(tokens) == 5000 and source == data.stdlib_corpus(5000)[1]
