"""meshfit: train, evaluate and use MLP regressors on a JAX device mesh.

This file is intentionally kept short: flags -> config -> one call into
meshfit (`loop.train_and_evaluate`, `evaluate.evaluate`, `predict.predict`
or `export.export`). README.md has the usage; bad input exits with status 2
and one `error: ...` line.
"""

import atexit
import json
import logging as std_logging
import os
import sys
import threading

if __name__ == '__main__':
  # First, so that it runs last: see _end_now.
  atexit.register(lambda: _end_now())  # noqa: PLW0108 (defined below)


class _SerialStream:
  """A stream whose writes take one lock each, flushed before it is let go.

  stderr is wrapped so before anything can hold it (absl's handler keeps the
  stream it was made with): `_fail` takes the lock and keeps it, which
  waits for a write in flight, even one blocked on a full pipe, and lets no
  later one through, so that the error line is the last. Everything else is
  the wrapped stream's.
  """

  def __init__(self, stream):
    self.wrapped = stream
    self.lock = threading.RLock()  # a signal handler may write mid-write

  def write(self, text: str) -> int:
    with self.lock:
      written = self.wrapped.write(text)
      self.wrapped.flush()  # out while the lock is held
      return written

  def writelines(self, lines) -> None:
    for line in lines:
      self.write(line)

  def flush(self) -> None:
    with self.lock:
      self.wrapped.flush()

  def __getattr__(self, name: str):
    return getattr(self.wrapped, name)


sys.stderr = _SerialStream(sys.stderr)

# Before TensorFlow, TFDS, JAX, Orbax and etils are imported: local, quiet,
# meshfit's XLA flags, one gs:// endpoint for every storage client.
from meshfit.parallel import process  # noqa: E402  (imports no jax)
from meshfit import storage  # noqa: E402  (imports neither jax nor gcsfs)

process.prepare()

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

FLAGS = flags.FLAGS
USAGE_EXIT = 2
DIVERGED_EXIT = 3  # a non-finite loss: not bad usage, not a crash


def _fail(message: str) -> None:
  """One `error:` line on stderr and exit status 2: bad input, no traceback.

  The line must stay the last one while another thread may be printing
  (most likely Orbax's, after a damaged checkpoint's restore failed):
  logging is switched off and its handlers' locks taken, stderr's lock
  (`_SerialStream`) too, each waiting for a write in flight and kept, so
  nothing written through them follows; thread and unraisable exceptions go
  unprinted; file descriptor 2 is pointed at /dev/null for C code's writes,
  and the line goes to a copy of it. Then os._exit, not sys.exit: the
  interpreter's teardown can print after the line (Orbax's event loop:
  "Event loop is closed"), and a usage error leaves nothing that teardown
  must finish.
  """
  std_logging.disable(std_logging.CRITICAL)
  for handler in _all_handlers():
    handler.acquire()  # held until the process ends
  threading.excepthook = lambda args: None
  sys.unraisablehook = lambda unraisable: None
  try:
    sys.stdout.flush()
  except (OSError, ValueError):  # a closed pipe: nothing more can be said
    pass
  stream = sys.stderr
  if isinstance(stream, _SerialStream):
    stream.lock.acquire()  # held until the process ends
    stream = stream.wrapped
  try:
    stream.flush()
  except (OSError, ValueError):
    pass
  stderr = os.dup(2)
  os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
  os.write(stderr, f'error: {message}\n'.encode())
  os._exit(USAGE_EXIT)


def _all_handlers() -> list[std_logging.Handler]:
  """Every handler of every logger that exists (absl's on the root)."""
  loggers = [std_logging.getLogger(), *(
      logger for logger in std_logging.Logger.manager.loggerDict.values()
      if isinstance(logger, std_logging.Logger))]
  return list({id(h): h for logger in loggers for h in logger.handlers
               }.values())


def _config_error(e: Exception, argv: list[str]) -> str:
  """Says what went wrong loading the config file or its overrides."""
  if isinstance(e, (AttributeError, KeyError)):
    unknown = _unknown_override(argv)
    if unknown:
      return unknown
  first_line = str(e).strip().splitlines()[0] if str(e).strip() else ''
  config_file = next((a.split('=', 1)[1] for a in argv[1:]
                      if a.startswith('--config=')), 'configs/default.py')
  return (f'cannot load config file {config_file}: {type(e).__name__}: '
          f'{first_line}; check the path and that it defines get_config()')


def _unknown_override(argv: list[str]) -> str | None:
  """The first --config.KEY=... whose KEY configs/default.py does not
  declare, with the nearest declared key, or None."""
  from meshfit.config import overrides  # noqa: PLC0415  (on errors only)

  for arg in argv[1:]:
    if arg.startswith('--config.'):
      key = arg[len('--config.'):].split('=', 1)[0]
      if (message := overrides.unknown_key_message(key, arg)) is not None:
        return message
  return None


# ml_collections loads the default config file, with the command line's
# overrides, as soon as the flag is defined.
try:
  config_flags.DEFINE_config_file(
      'config', os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             'configs', 'default.py'),
      'Training configuration file (default: configs/default.py).',
      lock_config=True)
except Exception as e:  # noqa: BLE001 (user input: reported, not a crash)
  _fail(_config_error(e, sys.argv))
flags.DEFINE_string('workdir', 'runs/default', 'Run directory: config.json, '
                    'checkpoints/, metrics.jsonl, TensorBoard events, eval/.')
flags.DEFINE_enum('mode', 'train', ['train', 'eval', 'predict', 'export'],
                  'train (resumes if the workdir holds a run), eval, '
                  'predict (--input to --output) or export (serving '
                  'artifacts into --output).')
flags.DEFINE_integer('step', None, 'Checkpoint step for --mode=eval, '
                     '--mode=predict and --mode=export (default: the '
                     'newest).')
flags.DEFINE_string('input', None, '--mode=predict: CSV or Parquet file with '
                    'the feature columns (by name; others are ignored).')
flags.DEFINE_string('output', None, '--mode=predict: CSV or Parquet file to '
                    'write: the input rows in order, one <target>_pred column '
                    'per target (and <target>_std for a gaussian model). '
                    '--mode=export: a new or empty directory for '
                    'the SavedModel, the jax.export artifact and model.json.')
flags.DEFINE_list('keep_columns', [], '--mode=predict: input columns copied '
                  'into the output, e.g. --keep_columns=id,date.')
flags.DEFINE_float('interval', None, '--mode=predict, a model trained with '
                   'model.likelihood=gaussian: also write the central '
                   'interval of this probability, e.g. 0.9, as '
                   '<target>_lower and <target>_upper.')
flags.DEFINE_bool('library_logs', False, "Show the libraries' INFO logs "
                  '(JAX, optax, TFDS, Orbax); their warnings and errors '
                  'always show. Part of --verbose.')
flags.DEFINE_bool('verbose', False, 'Also log every log step\'s scalars as '
                  'INFO lines, the libraries\' INFO logs (--library_logs) '
                  'and, in a multi-host job, the INFO lines of processes '
                  'other than 0 (which otherwise show warnings and errors '
                  'only).')
# Multi-host (docs/multihost.md): automatic under SLURM, Open MPI, Kubernetes
# and on Cloud TPU VMs; elsewhere every process gets the same address and
# count and its own id, and any of them overrides the scheduler's. The timeouts
# are jax.distributed's defaults: a pod's hosts may start minutes apart, and a
# slow host is not a dead one.
flags.DEFINE_string('coordinator_address', None, 'HOST:PORT of process 0, '
                    'where the coordination service listens (multi-host).')
flags.DEFINE_integer('num_processes', None, 'Processes in the job '
                     '(multi-host); 1 runs alone even under a scheduler.')
flags.DEFINE_integer('process_id', None, 'This process, 0..num_processes-1 '
                     '(multi-host).')
flags.DEFINE_integer('heartbeat_timeout_seconds', 100, 'A process silent for '
                     'this long is dead and the others exit (multi-host).')
flags.DEFINE_integer('shutdown_timeout_seconds', 300, 'How long a finished '
                     'process waits at exit for the others (multi-host).')
flags.DEFINE_integer('initialization_timeout_seconds', 300, 'How long to '
                     'wait for every process to connect (multi-host).')


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, with bad flags and configs reported as usage errors."""
  try:
    remaining = FLAGS(argv)
    FLAGS.config.keys()  # the file is loaded lazily: surface its errors now
    return remaining
  except flags.Error as e:
    _fail(f'{e} (see python train.py --helpfull)')
  except Exception as e:  # noqa: BLE001 (user input: reported, not a crash)
    _fail(_config_error(e, argv))


def _paths_error() -> str | None:
  """A --workdir, --input or --output of a URL scheme meshfit does not know
  (before anything is written: `s4://x` would otherwise be a local path)."""
  for name in ('workdir', 'input', 'output'):
    if FLAGS[name].value:
      try:
        storage.check_scheme(FLAGS[name].value)
      except storage.StorageError as e:
        return f'--{name}: {e}'
  return None


def _predict_flags_error() -> str | None:
  """What is wrong with --input/--output/--keep_columns for this mode."""
  only_predict = [f'--{n}' for n in ('input', 'keep_columns', 'interval')
                  if FLAGS[n].present]
  if FLAGS.mode != 'predict' and only_predict:
    fix = 'drop them' if FLAGS.mode == 'export' else ('add --mode=predict or '
                                                      'drop them')
    return (f'{", ".join(only_predict)}: only for --mode=predict, not '
            f'--mode={FLAGS.mode}; {fix}')
  if FLAGS.mode in ('train', 'eval'):
    if FLAGS['output'].present:
      return (f'--output: only for --mode=predict and --mode=export, not '
              f'--mode={FLAGS.mode}; add one of them or drop it')
    return None
  if FLAGS.mode == 'export':
    if not FLAGS.output:
      return ('--mode=export needs --output=DIR, a new or empty directory '
              'for the artifacts')
    return None
  missing = [f'--{n}' for n in ('input', 'output') if not FLAGS[n].value]
  if missing:
    return (f'--mode=predict needs {" and ".join(missing)}, e.g. '
            '--input=new_rows.csv --output=predictions.csv')
  if FLAGS.interval is not None and not 0 < FLAGS.interval < 1:
    return (f'--interval={FLAGS.interval:g} is not a probability strictly '
            'between 0 and 1; use e.g. --interval=0.9')
  return None


def _overridden_keys() -> list[str]:
  """Config keys set on the command line with --config.KEY=VALUE."""
  return [name[len('config.'):] for name in FLAGS
          if name.startswith('config.') and FLAGS[name].present]


def main(argv: list[str]) -> None:
  from meshfit.report.log_filter import LogFilter  # noqa: PLC0415 (no jax)

  # Before anything logs: JAX's search for a TPU is its first INFO record.
  log_filter = LogFilter(library_logs=FLAGS.library_logs or FLAGS.verbose,
                         every_process=FLAGS.verbose)
  logging.get_absl_handler().addFilter(log_filter)
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]}; every option is a --flag')
  if (message := _paths_error() or _predict_flags_error()) is not None:
    _fail(message)
  # After flag parsing, so that --help stays fast; before any other JAX use.
  from meshfit.errors import UsageError  # noqa: PLC0415
  from meshfit.parallel import distributed  # noqa: PLC0415

  try:
    _, num_processes = distributed.initialize(distributed.Options(
        FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id,
        FLAGS.heartbeat_timeout_seconds, FLAGS.shutdown_timeout_seconds,
        FLAGS.initialization_timeout_seconds), log_filter.joined)
  except UsageError as e:
    _fail(str(e))
  with distributed.exit_at_once_on_failure(num_processes):
    _run()


def _run() -> None:
  """Runs the mode the flags name (after the job is joined)."""
  import jax  # noqa: PLC0415  (after flag parsing: --help stays fast)

  from meshfit.input_pipeline.errors import DataError  # noqa: PLC0415
  from meshfit.api import runs  # noqa: PLC0415
  from meshfit.config import json_files  # noqa: PLC0415
  from meshfit.errors import UsageError  # noqa: PLC0415
  from meshfit.report import progress  # noqa: PLC0415
  from meshfit.serve import evaluate, export, predict  # noqa: PLC0415
  from meshfit.train import loop, preemption  # noqa: PLC0415
  from meshfit.train.loss_watch import NonFiniteLossError  # noqa: PLC0415

  logging.info('JAX process %d/%d, local devices: %s', jax.process_index(),
               jax.process_count(), jax.local_devices())
  try:
    if FLAGS.mode == 'train':
      if FLAGS.step is not None:
        raise UsageError('--step is for --mode=eval, --mode=predict and '
                         '--mode=export; training always resumes from the '
                         'newest checkpoint')
      loop.train_and_evaluate(FLAGS.config, FLAGS.workdir,
                              console=progress.Console(
                                  progress=True, log_scalars=FLAGS.verbose))
    else:
      keys = (json_files.flatten(FLAGS.config) if FLAGS['config'].present
              else _overridden_keys())
      config = runs.run_config(
          FLAGS.workdir, FLAGS.config, keys,
          keep_mesh=any(k.startswith('mesh.') for k in _overridden_keys()))
      if FLAGS.mode == 'eval':
        result = evaluate.evaluate(config, FLAGS.workdir, FLAGS.step)
      elif FLAGS.mode == 'export':
        result = export.export(config, FLAGS.workdir, FLAGS.output,
                               FLAGS.step)
      else:
        result = predict.predict(config, FLAGS.workdir, FLAGS.input,
                                 FLAGS.output, FLAGS.step, FLAGS.keep_columns,
                                 FLAGS.interval)
      print(json.dumps(result, indent=2))
  except (UsageError, DataError, storage.StorageError) as e:
    _fail(str(e))
  except NonFiniteLossError as e:
    sys.stderr.write(f'error: {e.explain(FLAGS.workdir)}\n')
    sys.exit(DIVERGED_EXIT)
  except preemption.Preempted as e:
    logging.warning('%s', e)
    sys.exit(preemption.EXIT_CODE)


# The exit status _end_now ends the process with: an uncaught exception's
# until main's SystemExit says otherwise.
_status = 1


def _end_now() -> None:
  """The last exit hook: ends the process as Python's exit would, less the
  teardown of modules.

  Registered before anything else is imported, so it runs after every
  other exit hook (they run last registered, first run: logging's flush,
  JAX's backend and jax.distributed shutdown) and after Python has joined
  the threads. Freeing every module's objects (JAX's, XLA's) one by one took
  ~0.5 s of a small table's 4 s run (docs/performance.md) and writes
  nothing.
  """
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):  # a closed pipe (`| head`)
      pass
  os._exit(_status)


if __name__ == '__main__':
  try:
    app.run(main, flags_parser=_parse_flags)
  except SystemExit as e:
    # As Python reads it: None is 0, a message is printed and is 1.
    _status = (0 if e.code is None else e.code if isinstance(e.code, int)
               else 1)
    raise
  except KeyboardInterrupt:
    _status = 130  # as a shell reports a process that Ctrl-C stopped
    raise
