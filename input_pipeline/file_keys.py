"""Which files a table is, and the keys of their contents: the training
files a `dataset.train_path` names (a glob, or several), their digests
(each process hashes its share) and the prepared dataset's content key.

A local file's digest is the sha256 of its bytes. A gs:// object's is made
from its metadata, never its bytes: downloading a table whole only to key
it would cost what preparing it costs. GCS computes an object's MD5 and
CRC32C from its bytes when it is written and never changes an object in
place (a rewrite is a new object, with a new generation and its own
hashes), so size + MD5 + CRC32C name the content as the sha256 does: a
changed file would have to keep its size, its 128-bit MD5 and its CRC32C by
accident. The same bytes under another name or uploaded again keep the
key, as a local file moved elsewhere does. A composite object (made by
`compose`, as parallel uploads are) has no MD5; its generation is keyed
then, which changes with every write: a re-upload of the same bytes is
prepared again, a changed one always is.
"""

import glob
import hashlib
import json
from collections.abc import Callable, Sequence

import numpy as np

from meshfit import storage
from meshfit.input_pipeline import column_plan, table_files
from meshfit.input_pipeline.errors import DataError
from meshfit.input_pipeline.paths import named
from meshfit.storage import gcs  # the metadata of an object, for its key

# Changing how files are parsed, encoded or stored must change the key.
_KEY_SCHEMA = 'meshfit.csv_regression/7'
# Bytes hashed at a time: a file is never read whole.
_HASH_READ = 8 << 20
# (this process's array) -> every process's, stacked (jax's
# multihost_utils.process_allgather).
Gather = Callable[[np.ndarray], np.ndarray]


def train_files(train_path: str | Sequence[str]) -> list[str]:
  """The training files a `dataset.train_path` names, in order.

  A string is split at commas unless it names a file as it is; a path with
  glob characters stands for its matches, sorted.

  Raises:
    DataError: a glob matches nothing, or a file is named twice.
  """
  source = 'dataset.train_path'
  with named(source):
    if isinstance(train_path, str):
      paths = ([train_path] if storage.isfile(train_path) else
               [p.strip() for p in train_path.split(',') if p.strip()]
               or [''])
    else:
      paths = list(train_path)
    files = []
    for path in paths:
      if glob.has_magic(path):
        matches = [p for p in storage.glob(path) if storage.isfile(p)]
        if not matches:
          raise DataError(f'{source} {path!r} matches no file; give the path '
                          'of a CSV or Parquet file, or a glob such as '
                          'data/train-*.parquet')
        files.extend(matches)
      else:
        files.append(path)
    seen = set()
    for path in files:
      if storage.absolute(path) in seen:
        raise DataError(f'{source} names {path!r} twice; name each training '
                        'file once')
      seen.add(storage.absolute(path))
  return files


def file_digest(path: str, source: str = '') -> bytes:
  """A file's 32-byte digest: of its bytes read in pieces (never the whole
  file), or of a gs:// object's metadata (see the module doc).

  Raises:
    DataError: the file is missing or not a file.
  """
  table_files.check_file(path, source)
  if storage.is_remote(path):
    return _object_digest(path, source)
  digest = hashlib.sha256()
  with storage.open(path, 'rb') as f:
    while piece := f.read(_HASH_READ):
      digest.update(piece)
  return digest.digest()


def _object_digest(url: str, source: str = '') -> bytes:
  """The digest of the gs:// object `url`, from its metadata alone.

  Raises:
    DataError: the object is missing.
  """
  with named(source):
    info = gcs.info(url)
  if info is None or info.get('type') != 'file':
    raise DataError(f'{table_files.describe(url, source)} does not exist; '
                    'give the path of a CSV or Parquet file with a header row')
  fields = {'size': int(info['size']), 'md5': info.get('md5Hash') or '',
            'crc32c': info.get('crc32c') or ''}
  if not fields['md5']:
    fields['generation'] = str(info.get('generation') or info.get('updated'))
  text = json.dumps(['gs-object/1', fields], sort_keys=True)
  return hashlib.sha256(text.encode()).digest()


def digests(paths: Sequence[str], sources: Sequence[str], process_index: int,
             process_count: int, gather: Gather | None) -> list[bytes]:
  """Every file's digest; each process hashes files i % P == its index."""
  if gather is None or process_count == 1:
    return [file_digest(p, s) for p, s in zip(paths, sources)]
  # Every process checks every file exists (a cheap stat), so a missing
  # one is an error on all of them alike, before any collective.
  for path, source in zip(paths, sources):
    table_files.check_file(path, source)
  mine = np.zeros((-(-len(paths) // process_count), 32), np.uint8)
  for j, i in enumerate(range(process_index, len(paths), process_count)):
    mine[j] = np.frombuffer(file_digest(paths[i], sources[i]), np.uint8)
  every = np.asarray(gather(mine))  # process x file of its share x 32
  return [every[i % process_count, i // process_count].tobytes()
          for i in range(len(paths))]


def content_key(train_digests: Sequence[bytes], eval_digest: bytes,
                target_columns: Sequence[str],
                feature_columns: Sequence[str],
                categorical_columns: Sequence[str] = (),
                category_min_count: int = column_plan.MIN_COUNT) -> str:
  """The prepared dataset's name for these files' contents and selection."""
  digest = hashlib.sha256()
  selection = json.dumps([_KEY_SCHEMA, list(target_columns),
                          list(feature_columns), list(categorical_columns),
                          len(train_digests), category_min_count])
  for part in (selection.encode(), *train_digests, eval_digest):
    # Length prefixes: no two different inputs concatenate to the same bytes.
    digest.update(len(part).to_bytes(8, 'little'))
    digest.update(part)
  return f'sha256_{digest.hexdigest()[:32]}'


def file_key(train_digests: Sequence[bytes]) -> str:
  """A short content key of the training files (what a checkpoint was
  trained on)."""
  digest = (train_digests[0] if len(train_digests) == 1 else
            hashlib.sha256(b''.join(train_digests)).digest())
  return f'sha256_{digest.hex()[:16]}'
