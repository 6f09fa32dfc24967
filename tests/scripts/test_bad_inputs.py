"""The bad-input table: every user mistake ends in one line, a non-zero exit, no
traceback, and the workdir exactly as it was (same paths, same bytes: nothing created, nothing changed).

``CASES`` below holds one row per case: (id, how it is made, a substring the last stderr line must hold).
How a case is made:

* ``'--flag ...'``      command-line arguments appended to a valid ``listops:tiny`` command;
* ``Cfg('code')``       a config file of our own whose ``get_config()`` runs ``code`` on the tiny config
                        ``c`` (for values the command line cannot express: ``retyped(c, field, value)``
                        gives a field a value of another type, e.g. a string batch size);
* ``Data(task, path, content, *flags)``  a data file written (bytes) under the data dir, then the flags;
* ``Fn(setup)``         anything else: ``setup(ctx)`` changes the files or the environment and returns flags.

The cases run in-process through the real entry point (``kernelformer.cli.main(['train', ...])``, what
``scripts/train.py`` and ``python -m kernelformer train`` call), with absl's flag state reset between
them (80 subprocesses of python + jax would take minutes); ``SUBPROCESS_CASES`` also run as real
``scripts/train.py`` / ``python -m kernelformer`` processes. A case that wrongly passes validation would
reach ``steps.build_model``, which the runner replaces with a failure, so nothing ever trains here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Any, Callable

import pytest
from absl import app, flags

from kernelformer import cli as kernelformer_cli
from kernelformer.training import steps as steps_lib
from kernelformer.training import validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, 'configs', 'listops.py') + ':tiny'

GOOD_LISTOPS = b'Source\tTarget\r\n' + b'( ( [MAX 2 ) 3 ) ] )\t3\r\n' * 4
LISTOPS_FIXED = ('--config.data.generate=False',)   # the listops files below are written, not generated


@dataclasses.dataclass(frozen=True)
class Cfg:
  code: str            # run inside get_config() on ``c`` (the listops tiny config, unlocked)


@dataclasses.dataclass(frozen=True)
class Data:
  task: str            # 'listops' (files in the tiny config's split dir), 'retrieval' or 'pathfinder'
  path: str            # relative to the task's directory
  content: bytes | None  # None: make a directory there
  flags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Fn:
  setup: Callable[['Ctx'], list[str]]


# ----------------------------------------------------------------------------------------------
# Setups that need more than a flag.


def _workdir_is_file(ctx):
  ctx.workdir_is(b'a file, not a directory')
  return []


def _workdir_parent_is_file(ctx):
  with open(os.path.join(ctx.tmp, 'parentfile'), 'wb') as f:
    f.write(b'x')
  ctx.watch(os.path.join(ctx.tmp, 'parentfile'))
  return [f'--workdir={os.path.join(ctx.tmp, "parentfile", "run")}']


def _checkpoints_is_file(ctx):
  with open(os.path.join(ctx.workdir, 'checkpoints'), 'wb') as f:
    f.write(b'not a directory')
  return []


def _read_only_workdir(ctx):
  if os.geteuid() == 0:
    # root writes through a chmod: stand in for a read-only file system at the probe.
    real = validate.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):  # pylint: disable=redefined-builtin
      if dir and os.path.abspath(dir) == ctx.workdir:
        raise OSError(30, 'Read-only file system')
      return real(*args, dir=dir, **kwargs)
    ctx.monkeypatch.setattr(validate.tempfile, 'mkstemp', mkstemp)
  else:
    os.chmod(ctx.workdir, 0o555)
    ctx.cleanup.append(lambda: os.chmod(ctx.workdir, 0o755))
  return []


def _read_only_parent(ctx):
  parent = os.path.join(ctx.tmp, 'ro_parent')
  os.makedirs(parent)
  if os.geteuid() == 0:
    real = validate.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):  # pylint: disable=redefined-builtin
      if dir and os.path.abspath(dir) == parent:
        raise PermissionError(13, 'Permission denied')
      return real(*args, dir=dir, **kwargs)
    ctx.monkeypatch.setattr(validate.tempfile, 'mkstemp', mkstemp)
  else:
    os.chmod(parent, 0o555)
    ctx.cleanup.append(lambda: os.chmod(parent, 0o755))
  ctx.watch(parent)
  return [f'--workdir={os.path.join(parent, "run")}']


def _disk_full(free_bytes):
  def setup(ctx):
    usage = shutil.disk_usage(ctx.tmp)
    ctx.monkeypatch.setattr(validate.shutil, 'disk_usage',
                            lambda p: usage._replace(free=free_bytes))
    return []
  return setup


def _disk_short_by(missing_bytes):
  """Free space ``missing_bytes`` short of what validation demands of the tiny config."""
  def setup(ctx):
    from configs import listops  # pylint: disable=g-import-not-at-top
    c = listops.get_config('tiny')
    with c.unlocked():
      c.data.data_dir = ctx.data_dir
    return _disk_full(validate.checkpoint_bytes_needed(c) - missing_bytes)(ctx)
  return setup


def _linked_in_workdir(name: str, target: str):
  def setup(ctx):
    os.symlink(target, os.path.join(ctx.workdir, name))
    return []
  return setup


def _sparse_in_workdir(name: str, size: int):
  def setup(ctx):
    with open(os.path.join(ctx.workdir, name), 'wb') as f:
      f.truncate(size)   # sparse: no disk used
    return []
  return setup


def _data_dir_is_file(ctx):
  path = os.path.join(ctx.tmp, 'datafile')
  with open(path, 'wb') as f:
    f.write(b'x')
  return [f'--config.data.data_dir={path}']


def _config_is_dir(ctx):
  d = os.path.join(ctx.tmp, 'cfgdir.py')
  os.makedirs(d)
  return [f'--config={d}']


def _pathfinder_fixture(n_images=12):
  def setup(ctx):
    from lra_tasks import fixtures  # pylint: disable=g-import-not-at-top
    fixtures.write_pathfinder_fixture(ctx.data_dir, 32, 'hard', n_images, seed=0)
    return []
  return setup


def _pathfinder_with(relative: str, content: bytes):
  def setup(ctx):
    _pathfinder_fixture()(ctx)
    path = os.path.join(ctx.data_dir, 'pathfinder32', 'curv_contour_length_14', relative)
    with open(path, 'wb') as f:
      f.write(content)
    return []
  return setup


def _pathfinder_missing_image(ctx):
  _pathfinder_fixture()(ctx)
  os.remove(os.path.join(ctx.data_dir, 'pathfinder32', 'curv_contour_length_14', 'imgs', '0',
                         'sample_0.png'))
  return []


def _pathfinder_wrong_size(ctx):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  _pathfinder_fixture()(ctx)
  path = os.path.join(ctx.data_dir, 'pathfinder32', 'curv_contour_length_14', 'imgs', '0',
                      'sample_0.png')
  Image.fromarray(np.zeros((16, 16), np.uint8)).save(path, format='PNG')
  return []


def _pathfinder_misplaced(ctx):
  from lra_tasks import fixtures  # pylint: disable=g-import-not-at-top
  fixtures.write_pathfinder_fixture(os.path.join(ctx.data_dir, 'lra_release'), 32, 'hard', 6, seed=0)
  return []


def _retrieval_fixture(ctx):
  from lra_tasks import fixtures  # pylint: disable=g-import-not-at-top
  fixtures.write_retrieval_fixture(ctx.data_dir, 4, seed=0)
  return []


def _retrieval_with(split_file: str, content: bytes):
  def setup(ctx):
    _retrieval_fixture(ctx)
    with open(os.path.join(ctx.data_dir, 'retrieval', split_file), 'wb') as f:
      f.write(content)
    return []
  return setup


def _retrieval_misplaced(ctx):
  from lra_tasks import fixtures  # pylint: disable=g-import-not-at-top
  fixtures.write_retrieval_fixture(os.path.join(ctx.data_dir, 'tsv_data_tmp'), 2, seed=0)
  os.rename(os.path.join(ctx.data_dir, 'tsv_data_tmp', 'retrieval'),
            os.path.join(ctx.data_dir, 'tsv_data'))
  return []


def _listops_partial_release(ctx):
  d = ctx.listops_dir()
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, 'basic_train.tsv'), 'wb') as f:
    f.write(GOOD_LISTOPS)
  return ['--config.data.generate=True']


def _locked_workdir(ctx):
  # A run in progress on this host: pid 1 is alive in every container and machine.
  with open(os.path.join(ctx.workdir, 'lock'), 'w', encoding='utf-8') as f:
    json.dump({'pid': 1, 'host': socket.gethostname(), 'started': '2026-01-01T00:00:00'}, f)
  return []


def _in_workdir(name: str, content: bytes):
  def setup(ctx):
    with open(os.path.join(ctx.workdir, name), 'wb') as f:
      f.write(content)
    return []
  return setup


def _other_config_run(ctx):
  from configs import listops  # pylint: disable=g-import-not-at-top
  from kernelformer.training import record as record_lib  # pylint: disable=g-import-not-at-top
  c = listops.get_config('tiny')
  with c.unlocked():
    c.seed = 7
    c.data.data_dir = ctx.data_dir
    c.progress = False
  record_lib.RunRecord(ctx.workdir).write(c, [], 0)
  return []


PF = (f'--config={os.path.join(ROOT, "configs", "pathfinder.py")}:tiny',)
RT = (f'--config={os.path.join(ROOT, "configs", "retrieval.py")}:tiny',)
TRAIN, VAL, TEST = 'basic_train.tsv', 'basic_val.tsv', 'basic_test.tsv'
RT_TRAIN = 'new_aan_pairs.train.tsv'
META0 = 'metadata/0.npy'

# ----------------------------------------------------------------------------------------------
# The table: (id, how it is made, substring of the last stderr line).

CASES: list[tuple[str, Any, str]] = [
    # --- command line and config file
    ('unknown_flag', '--bogus=1', "Unknown command line flag 'bogus'"),
    ('positional_arg', 'extra_arg', 'unexpected arguments: extra_arg'),
    ('config_missing_file', '--config=configs/nope.py', 'config file configs/nope.py not found'),
    ('config_is_directory', Fn(_config_is_dir), 'cfgdir.py'),
    ('unknown_preset', f'--config={TINY[:-5]}:bogus', "unknown listops preset 'bogus'"),
    ('config_import_error', Cfg('import no_such_module_kf'), "No module named 'no_such_module_kf'"),
    ('config_syntax_error', Cfg('def broken(:'), 'SyntaxError'),
    ('config_raises', Cfg("raise RuntimeError('boom in config')"), 'boom in config'),
    ('config_returns_none', Cfg('c = None'), 'get_config() returned None'),
    ('config_no_get_config', Cfg(None), 'defines no get_config()'),
    ('override_misspelled', '--config.model.num_layer=2', 'num_layer'),
    ('override_new_field', '--config.optim.momentum=0.9', 'momentum'),
    # --- types and ranges of fields
    ('batch_size_abc', '--config.batch_size=abc', "--config.batch_size=abc: invalid literal for int()"),
    ('batch_size_float', '--config.batch_size=8.5', "--config.batch_size=8.5"),
    ('batch_size_typed_in_file', Cfg("c.batch_size = '8'"), "Could not override field 'batch_size'"),
    ('batch_size_str_in_file', Cfg("c = retyped(c, 'batch_size', '8')"), "config.batch_size='8' is invalid"),
    ('batch_size_float_in_file', Cfg("c = retyped(c, 'batch_size', 8.5)"), 'config.batch_size=8.5 is invalid'),
    ('batch_size_negative', '--config.batch_size=-8', 'config.batch_size=-8 is invalid'),
    ('batch_size_zero', '--config.batch_size=0', 'config.batch_size=0 is invalid'),
    ('batch_size_indivisible', '--config.batch_size=7', 'batch_size=7 is not divisible by the 8 devices'),
    ('eval_batch_indivisible', '--config.eval_batch_size=12', 'eval_batch_size=12 is not divisible'),
    ('eval_batch_negative', '--config.eval_batch_size=-8', 'config.eval_batch_size=-8 is invalid'),
    ('grad_accum_zero', '--config.optim.grad_accum_steps=0', 'config.optim.grad_accum_steps=0'),
    ('grad_accum_indivisible', '--config.optim.grad_accum_steps=3', 'grad_accum_steps=3 must divide'),
    ('num_features_zero', ('--config.model.attention.kind=posrf-orf',
                           '--config.model.attention.num_features=0'),
     'config.model.attention.num_features=0 is invalid'),
    ('num_features_negative', ('--config.model.attention.kind=posrf-orf',
                               '--config.model.attention.num_features=-4'),
     'config.model.attention.num_features=-4 is invalid'),
    ('num_features_abc', ('--config.model.attention.kind=posrf-orf',
                          '--config.model.attention.num_features=abc'), 'num_features=abc'),
    ('num_train_steps_zero', '--config.num_train_steps=0', 'config.num_train_steps=0 is invalid'),
    ('num_train_steps_negative', '--config.num_train_steps=-5', 'config.num_train_steps=-5'),
    ('learning_rate_negative', '--config.optim.learning_rate=-0.001', 'config.optim.learning_rate=-0.001'),
    ('learning_rate_zero', '--config.optim.learning_rate=0', 'config.optim.learning_rate=0'),
    ('learning_rate_nan', '--config.optim.learning_rate=nan', 'config.optim.learning_rate=nan'),
    ('learning_rate_inf', '--config.optim.learning_rate=inf', 'config.optim.learning_rate=inf'),
    ('learning_rate_str', Cfg("c = retyped(c, 'optim.learning_rate', 'fast')"), "learning_rate='fast'"),
    ('warmup_negative', '--config.optim.warmup_steps=-1', 'config.optim.warmup_steps=-1'),
    ('weight_decay_negative', '--config.optim.weight_decay=-0.1', 'config.optim.weight_decay=-0.1'),
    ('b1_one', '--config.optim.b1=1.0', 'config.optim.b1=1.0 is invalid'),
    ('b2_negative', '--config.optim.b2=-0.5', 'config.optim.b2=-0.5'),
    ('eps_zero', '--config.optim.eps=0', 'config.optim.eps=0'),
    ('grad_clip_negative', '--config.optim.grad_clip_norm=-1', 'config.optim.grad_clip_norm=-1'),
    ('schedule_unknown', '--config.optim.schedule=exp', "config.optim.schedule='exp'"),
    ('dropout_one', '--config.model.dropout_rate=1.0', 'config.model.dropout_rate=1.0'),
    ('dropout_negative', '--config.model.dropout_rate=-0.1', 'config.model.dropout_rate=-0.1'),
    ('attention_dropout_big', '--config.model.attention.attention_dropout=1.5',
     'config.model.attention.attention_dropout=1.5'),
    ('eval_every_zero', '--config.eval_every=0', 'config.eval_every=0'),
    ('checkpoint_every_zero', '--config.checkpoint_every=0', 'config.checkpoint_every=0'),
    ('log_every_negative', '--config.log_every=-1', 'config.log_every=-1'),
    ('keep_checkpoints_zero', '--config.keep_checkpoints=0', 'config.keep_checkpoints=0'),
    ('max_eval_batches_negative', '--config.max_eval_batches=-1', 'config.max_eval_batches=-1'),
    ('profile_steps_negative', '--config.profile_steps=-2', 'config.profile_steps=-2'),
    ('seed_negative', '--config.seed=-1', 'config.seed=-1'),
    ('seed_str_in_file', Cfg("c = retyped(c, 'seed', 'zero')"), "config.seed='zero'"),
    ('progress_not_bool', Cfg("c = retyped(c, 'progress', 'yes')"), 'config.progress=\'False\' is invalid: must be true or false'),
    ('emb_dim_zero', '--config.model.emb_dim=0', 'config.model.emb_dim=0'),
    ('num_layers_zero', '--config.model.num_layers=0', 'config.model.num_layers=0'),
    ('num_heads_zero', '--config.model.num_heads=0', 'config.model.num_heads=0'),
    ('mlp_dim_negative', '--config.model.mlp_dim=-64', 'config.model.mlp_dim=-64'),
    ('qkv_not_divisible', '--config.model.qkv_dim=15', 'config.model.qkv_dim=15 is invalid: must be divisible'),
    ('pooling_unknown', '--config.model.pooling=max', "config.model.pooling='max'"),
    ('pos_encoding_unknown', '--config.model.pos_encoding=rotary', "config.model.pos_encoding='rotary'"),
    ('dtype_unknown', '--config.model.dtype=float64', "config.model.dtype='float64'"),
    ('max_length_zero', '--config.data.max_length=0', 'config.data.max_length=0'),
    ('num_train_zero', '--config.data.num_train=0',
     'config.data.num_train=0 is invalid: must be an integer >= 1 (the train split would be empty)'),
    ('num_test_zero', '--config.data.num_test=0', 'config.data.num_test=0 is invalid'),
    ('data_dir_empty', '--config.data.data_dir=', 'config.data.data_dir'),
    # --- task, kind, impl and their combinations
    ('task_unknown', '--config.data.task=listopz', "config.data.task='listopz'"),
    ('task_empty', '--config.data.task=', 'config.data.task'),
    ('kind_unknown', '--config.model.attention.kind=favorplus', "unknown attention kind 'favorplus'"),
    ('impl_cuda', ('--config.model.attention.kind=posrf-orf', '--config.model.attention.impl=cuda'),
     "config.model.attention.impl='cuda' is invalid"),
    ('impl_pallas_unfused', ('--config.model.attention.kind=saderf-orf',
                             '--config.model.attention.impl=pallas'),
     "impl='pallas' is invalid for kind 'saderf-orf'"),
    ('impl_on_softmax', '--config.model.attention.impl=xla', 'is not read by attention kind'),
    ('rpe_unsupported', ('--config.model.attention.kind=skyformer', '--config.model.attention.rpe=True'),
     "rpe=True is invalid for kind 'skyformer'"),
    ('rpe_linformer', ('--config.model.attention.kind=linformer', '--config.model.attention.rpe=True'),
     "rpe=True is invalid for kind 'linformer'"),
    ('distill_without_map', ('--config.model.attention.kind=relu',
                             '--config.model.attention.distill_weight=0.1'),
     "distill_weight > 0 is invalid for kind 'relu'"),
    ('distill_negative', ('--config.model.attention.kind=hedgehog',
                          '--config.model.attention.distill_weight=-1'),
     'distill_weight=-1.0 is invalid: must be a finite number >= 0'),
    ('cos_length_negative', ('--config.model.attention.kind=cosformer',
                             '--config.model.attention.cos_length=-3'),
     'cos_length=-3 is invalid: must be an integer >= 0'),
    ('cos_length_short', ('--config.model.attention.kind=cosformer',
                          '--config.model.attention.cos_length=8'),
     "cos_length=8 is invalid: cosFormer's horizon M must cover the longest sequence"),
    ('option_not_read', ('--config.model.attention.kind=posrf-orf',
                         '--config.model.attention.num_landmarks=16'), 'num_landmarks is not read'),
    ('covariance_unknown', ('--config.model.attention.kind=generative-rks',
                            '--config.model.attention.covariance=spherical'),
     "config.model.attention.covariance='spherical'"),
    ('fastfood_variant_unknown', ('--config.model.attention.kind=posrf-fastfood',
                                  '--config.model.attention.fastfood_variant=xyz'),
     "fastfood_variant='xyz'"),
    ('redraw_negative', ('--config.model.attention.kind=posrf-orf',
                         '--config.model.attention.redraw_every=-1'), 'redraw_every=-1'),
    ('chunk_size_zero', ('--config.model.attention.kind=posrf-orf',
                         '--config.model.attention.chunk_size=0'), 'chunk_size=0'),
    ('feature_eps_negative', ('--config.model.attention.kind=posrf-orf',
                              '--config.model.attention.feature_eps=-1e-6'), 'feature_eps=-1e-06'),
    ('landmarks_zero', ('--config.model.attention.kind=nystromformer',
                        '--config.model.attention.num_landmarks=0'), 'num_landmarks=0'),
    ('gamma_negative', ('--config.model.attention.kind=skyformer', '--config.model.attention.gamma=-1'),
     'gamma=-1'),
    ('linformer_k_zero', ('--config.model.attention.kind=linformer',
                          '--config.model.attention.linformer_k=0'), 'linformer_k=0'),
    ('softmax_impl_unknown', '--config.model.attention.implementation=flash',
     "implementation='flash'"),
    ('listops_depth_zero', '--config.data.max_depth=0', 'max_depth >= 1'),
    ('pathfinder_resolution', (*PF, '--config.data.resolution=48'), 'data.resolution must be one of'),
    ('pathfinder_difficulty', (*PF, '--config.data.difficulty=medium'), 'data.difficulty must be one of'),
    ('pathfinder_max_length', (*PF, '--config.data.max_length=100'), 'data.max_length must be'),
    # --- workdir and disk
    ('workdir_is_file', Fn(_workdir_is_file), 'is a file, not a directory'),
    ('workdir_parent_is_file', Fn(_workdir_parent_is_file), 'parentfile is a file'),
    ('workdir_checkpoints_is_file', Fn(_checkpoints_is_file), 'checkpoints is not a directory'),
    ('workdir_read_only', Fn(_read_only_workdir), 'is not writable'),
    ('workdir_parent_read_only', Fn(_read_only_parent), 'cannot be created'),
    ('disk_full', Fn(_disk_full(1 << 20)), 'not enough free disk space'),
    ('disk_nearly_full', Fn(_disk_short_by(1)), 'not enough free disk space'),
    ('workdir_empty', '--workdir=', 'workdir'),
    # --- the workdir's own state (kernelformer/training/workdir.py)
    ('workdir_locked', Fn(_locked_workdir), 'is in use by pid 1'),
    ('workdir_lock_unreadable', Fn(_in_workdir('lock', b'\x00garbage')), 'in use by an unreadable lock file'),
    ('workdir_other_config', Fn(_other_config_run), 'holds a run of another config (seed'),
    ('workdir_run_json_damaged', Fn(_in_workdir('run.json', b'{"fields": ')), 'run.json is damaged'),
    ('workdir_results_damaged', Fn(_in_workdir('results.json', b'{"final_step": ')),
     'results.json is damaged'),
    ('workdir_results_not_object', Fn(_in_workdir('results.json', b'[1, 2]')), 'results.json is damaged'),
    ('workdir_run_json_fields_list', Fn(_in_workdir('run.json', b'{"fingerprint": "ab", "fields": []}')),
     "run.json is damaged (TypeError: 'fields' must be an object, found list)"),
    ('workdir_run_json_not_object', Fn(_in_workdir('run.json', b'[]')), 'run.json is damaged'),
    # --- the run's files that misbehave: never read without bound
    ('workdir_metrics_dev_full', Fn(_linked_in_workdir('metrics.jsonl', '/dev/full')),
     'metrics.jsonl is a character device (a link to /dev/full), not a regular file'),
    ('workdir_metrics_dev_zero', Fn(_linked_in_workdir('metrics.jsonl', '/dev/zero')),
     'metrics.jsonl is a character device (a link to /dev/zero)'),
    ('workdir_metrics_dangling', Fn(_linked_in_workdir('metrics.jsonl', '/nonexistent/m.jsonl')),
     'metrics.jsonl is a link to a missing file'),
    ('workdir_metrics_huge', Fn(_sparse_in_workdir('metrics.jsonl', (1 << 30) + 1)),
     'metrics.jsonl is 1024 MiB, more than any run writes'),
    ('workdir_results_dev_zero', Fn(_linked_in_workdir('results.json', '/dev/zero')),
     'results.json is a character device'),
    ('workdir_run_json_dev_zero', Fn(_linked_in_workdir('run.json', '/dev/zero')),
     'run.json is a character device'),
    ('workdir_config_json_huge', Fn(_sparse_in_workdir('config.json', (64 << 20) + 1)),
     'config.json is 64 MiB, more than any run writes'),
    ('workdir_lock_dev_zero', Fn(_linked_in_workdir('lock', '/dev/zero')), 'lock is a character device'),
    ('on_nonfinite_unknown', '--config.on_nonfinite=ignore', "config.on_nonfinite='ignore'"),
    ('watchdog_negative', '--config.watchdog_step_s=-1', 'config.watchdog_step_s=-1'),
    # --- data files
    ('data_dir_is_file', Fn(_data_dir_is_file), 'is a file, not a directory'),
    ('listops_missing', LISTOPS_FIXED, 'basic_train.tsv is missing'),
    ('listops_non_utf8', Data('listops', TRAIN, GOOD_LISTOPS + b'( [MAX 2 \xff ] )\t3\r\n'),
     'basic_train.tsv:6: not UTF-8 text (byte 0xff'),
    ('listops_oversized_field', Data('listops', TRAIN, GOOD_LISTOPS + b'( [MAX 2 ' + b'1 ' * 70000
                                     + b'] )\t3\r\n'), 'basic_train.tsv:6: malformed row (field larger'),
    ('listops_three_columns', Data('listops', TRAIN, GOOD_LISTOPS + b'( [MAX 2 3 ] )\t3\t1\r\n'),
     'basic_train.tsv:6: expected 2 tab-separated fields'),
    ('listops_one_column', Data('listops', VAL, GOOD_LISTOPS + b'( [MAX 2 3 ] )\r\n'),
     'basic_val.tsv:6: expected 2 tab-separated fields'),
    ('listops_bad_target', Data('listops', TEST, GOOD_LISTOPS + b'( [MAX 2 3 ] )\tseven\r\n'),
     'basic_test.tsv:6: Target must be one digit'),
    ('listops_bad_header', Data('listops', TRAIN, b'src\ttgt\r\n( [MAX 2 3 ] )\t3\r\n'),
     'basic_train.tsv:1: header must be'),
    ('listops_empty_file', Data('listops', VAL, b''), 'basic_val.tsv:1: header must be'),
    ('listops_empty_split', Data('listops', TEST, b'Source\tTarget\r\n'), 'holds no examples'),
    ('listops_unknown_token', Data('listops', TRAIN, GOOD_LISTOPS + b'( [MAX 2 x ] )\t3\r\n'),
     "basic_train.tsv:6: unknown token(s) ['x']"),
    ('listops_empty_source', Data('listops', TRAIN, GOOD_LISTOPS + b'\t3\r\n'), 'basic_train.tsv:6: empty Source'),
    ('listops_split_is_dir', Data('listops', TRAIN, None, ('--config.data.generate=True',)),
     'exists but is not a file'),
    ('listops_partial_release', Fn(_listops_partial_release), 'and no generator.json'),
    ('retrieval_missing', RT, 'new_aan_pairs.train.tsv is missing'),
    ('retrieval_misplaced', (*RT, Fn(_retrieval_misplaced)), 'exists: move it there'),
    ('retrieval_columns', (*RT, Fn(_retrieval_with(RT_TRAIN, b'1\tA\tB\tb\'x\'\n'))),
     'new_aan_pairs.train.tsv:1: expected 5 tab-separated fields'),
    ('retrieval_bad_label', (*RT, Fn(_retrieval_with(RT_TRAIN, b'yes\tA\tB\tb\'x\'\tb\'y\'\n'))),
     'new_aan_pairs.train.tsv:1: label must be 0 or 1'),
    ('retrieval_empty_split', (*RT, Fn(_retrieval_with('new_aan_pairs.eval.tsv', b''))),
     'new_aan_pairs.eval.tsv holds no examples'),
    ('pathfinder_missing', PF, 'metadata/*.npy is missing'),
    ('pathfinder_misplaced', (*PF, Fn(_pathfinder_misplaced)), 'exists: move'),
    ('pathfinder_meta_non_utf8', (*PF, Fn(_pathfinder_with(META0, b'imgs/0 sample_0.png 0 1\xff\n'))),
     '0.npy:1: not a text metadata file'),
    ('pathfinder_meta_fields', (*PF, Fn(_pathfinder_with(META0, b'imgs/0 sample_0.png\n'))),
     '0.npy:1: expected at least 4 space-separated fields'),
    ('pathfinder_meta_label', (*PF, Fn(_pathfinder_with(META0, b'imgs/0 sample_0.png 0 2\n'))),
     '0.npy:1: label (4th field) must be 0 or 1'),
    ('pathfinder_missing_image', (*PF, Fn(_pathfinder_missing_image)), 'sample_0.png is missing'),
    ('pathfinder_wrong_size', (*PF, Fn(_pathfinder_wrong_size)), 'image is 16x16, expected 32x32'),
    ('pathfinder_too_few', (*PF, Fn(_pathfinder_fixture(4))), 'split is empty'),
]

# Cases that also run as real processes (the entry point as users start it).
SUBPROCESS_CASES = ('unknown_preset', 'batch_size_abc', 'learning_rate_negative', 'rpe_unsupported',
                    'workdir_is_file', 'listops_non_utf8')


# ----------------------------------------------------------------------------------------------
# The runner.


class Ctx:
  """One case's directories: ``workdir`` (pre-populated, watched), ``data_dir``, and any watched paths."""

  def __init__(self, tmp: str, monkeypatch):
    self.tmp = tmp
    self.monkeypatch = monkeypatch
    self.workdir = os.path.join(tmp, 'run')
    self.data_dir = os.path.join(tmp, 'data')
    self.cleanup: list[Callable[[], None]] = []
    os.makedirs(os.path.join(self.workdir, 'notes'))
    for name, content in (('notes.txt', b'keep me\n'), ('notes/results.json', b'{"mine": 1}\n')):
      with open(os.path.join(self.workdir, name), 'wb') as f:
        f.write(content)
    self.watched = [self.workdir]

  def workdir_is(self, content: bytes) -> None:
    shutil.rmtree(self.workdir)
    with open(self.workdir, 'wb') as f:
      f.write(content)

  def watch(self, path: str) -> None:
    self.watched.append(path)

  def listops_dir(self) -> str:
    from configs import listops  # pylint: disable=g-import-not-at-top
    from lra_tasks import listops as listops_task  # pylint: disable=g-import-not-at-top
    c = listops.get_config('tiny')
    with c.unlocked():
      c.data.data_dir = self.data_dir
    return listops_task.split_dir(c.data)

  def snapshot(self) -> dict[str, str]:
    out = {}
    for root in self.watched:
      if os.path.isfile(root):
        out[root] = _sha(root)
        continue
      for d, dirs, files in os.walk(root):
        out[d + '/'] = 'dir'
        for f in files:
          out[os.path.join(d, f)] = _sha(os.path.join(d, f))
    return out


def _sha(path: str) -> str:
  if os.path.islink(path):
    return 'link to ' + os.readlink(path)   # never read through (it may be /dev/zero)
  if os.path.getsize(path) > (16 << 20):
    st = os.stat(path)
    return f'size {st.st_size} mtime {st.st_mtime_ns}'
  return _sha_bytes(path)


def _sha_bytes(path: str) -> str:
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def _write_config(ctx: Ctx, code: str | None) -> str:
  path = os.path.join(ctx.tmp, 'my_config.py')
  if code is None:
    text = 'X = 1\n'
  else:
    body = '\n'.join('  ' + line for line in code.splitlines())
    text = ('import sys\n'
            f'sys.path.insert(0, {ROOT!r})\n'
            'import ml_collections\n'
            'from configs import listops\n\n\n'
            'def retyped(c, field, value):  # a field of another type: ConfigDict assignment would refuse\n'
            '  d = c.to_dict()\n'
            '  node = d\n'
            "  *parents, leaf = field.split('.')\n"
            '  for p in parents:\n'
            '    node = node[p]\n'
            '  node[leaf] = value\n'
            '  return ml_collections.ConfigDict(d)\n\n\n'
            'def get_config():\n'
            "  c = listops.get_config('tiny')\n"
            '  c.unlock()\n'
            f'{body}\n'
            '  return c\n')
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)
  return path


def _make(ctx: Ctx, how: Any) -> tuple[list[str], list[str]]:
  """(arguments that replace the defaults' --config, arguments appended) for one row's ``how``."""
  config_args: list[str] = []
  extra: list[str] = []
  parts = how if isinstance(how, tuple) else (how,)
  for part in parts:
    if isinstance(part, str):
      if part.startswith('--config='):
        config_args = [part]
      else:
        extra.append(part)
    elif isinstance(part, Cfg):
      config_args = [f'--config={_write_config(ctx, part.code)}']
    elif isinstance(part, Data):
      base = ctx.listops_dir() if part.task == 'listops' else os.path.join(ctx.data_dir, part.task)
      os.makedirs(base, exist_ok=True)
      if part.task == 'listops':
        for name in (TRAIN, VAL, TEST):
          with open(os.path.join(base, name), 'wb') as f:
            f.write(GOOD_LISTOPS)
        extra += LISTOPS_FIXED
      path = os.path.join(base, part.path)
      if part.content is None:
        os.remove(path)
        os.makedirs(path)
      else:
        with open(path, 'wb') as f:
          f.write(part.content)
      extra += part.flags
    elif isinstance(part, Fn):
      extra += part.setup(ctx)
    else:
      raise TypeError(part)
  config_args = [a for a in extra if a.startswith('--config=')][-1:] or config_args
  return config_args, [a for a in extra if not a.startswith('--config=')]


def argv_for(ctx: Ctx, how: Any) -> list[str]:
  config_args, extra = _make(ctx, how)
  base = ['--config', TINY] if not config_args else config_args
  return [*base, f'--workdir={ctx.workdir}', '--config.progress=False',
          f'--config.data.data_dir={ctx.data_dir}', *extra]


def _reset_absl() -> None:
  """What a fresh process has: absl's run-once guard down, flags unparsed, no per-field config flags
  from the last parse, no config module left under ml_collections' fixed module name."""
  app._register_and_parse_flags_with_usage.done = False  # pylint: disable=protected-access
  if flags.FLAGS.is_parsed():
    flags.FLAGS.unparse_flags()
  for name in [n for n in flags.FLAGS if n.startswith('config.')]:
    delattr(flags.FLAGS, name)
  sys.modules.pop('config_config', None)


def run_in_process(argv: list[str]) -> tuple[int, str]:
  """``kernelformer train ARGV`` in this process: (exit code, stderr)."""
  _reset_absl()
  err, out = io.StringIO(), io.StringIO()
  saved_argv = list(sys.argv)
  try:
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
      try:
        code = kernelformer_cli.main(['train', *argv])
      except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
  finally:
    sys.argv = saved_argv
    _reset_absl()
    flags.FLAGS.mark_as_parsed()  # as conftest leaves it for the other tests
  return code, err.getvalue()


def last_line(stderr: str) -> str:
  lines = [l for l in stderr.splitlines() if l.strip()]
  return lines[-1] if lines else ''


def check(code: int, stderr: str, expected: str, before: dict, after: dict) -> None:
  line = last_line(stderr)
  assert code not in (0, None), f'exit {code}; stderr: {stderr[-2000:]}'
  assert 'Traceback' not in stderr, stderr[-4000:]
  assert expected in line, f'{expected!r} not in the last stderr line {line!r}'
  assert after == before, 'the workdir changed: ' + str(
      sorted(set(after.items()) ^ set(before.items())))


class ReachedTraining(AssertionError):
  pass


@pytest.fixture
def no_training(monkeypatch):
  def build_model(*args, **kwargs):
    raise ReachedTraining('validation let this case through to build_model')
  monkeypatch.setattr(steps_lib, 'build_model', build_model)


def test_table_is_large_and_unique():
  ids = [c[0] for c in CASES]
  assert len(ids) >= 80 and len(set(ids)) == len(ids)
  assert set(SUBPROCESS_CASES) <= set(ids)


@pytest.mark.parametrize('case_id,how,expected', CASES, ids=[c[0] for c in CASES])
def test_bad_input(case_id, how, expected, tmp_path, monkeypatch, no_training):
  del case_id
  ctx = Ctx(str(tmp_path), monkeypatch)
  try:
    argv = argv_for(ctx, how)
    before = ctx.snapshot()
    code, stderr = run_in_process(argv)
    after = ctx.snapshot()
  finally:
    for f in ctx.cleanup:
      f()
  check(code, stderr, expected, before, after)


def test_valid_config_passes_validation(tmp_path, monkeypatch, no_training):
  """The control: the same runner with nothing wrong gets through validation to the model."""
  ctx = Ctx(str(tmp_path), monkeypatch)
  _reset_absl()
  with pytest.raises(ReachedTraining):
    try:
      kernelformer_cli.main(['train', *argv_for(ctx, ())])
    finally:
      _reset_absl()
      flags.FLAGS.mark_as_parsed()


def test_bad_inputs_real_processes(tmp_path, monkeypatch):
  """``SUBPROCESS_CASES`` as real processes, started together: alternately ``scripts/train.py`` and
  ``python -m kernelformer train``."""
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT,
         'XLA_FLAGS': '--xla_force_host_platform_device_count=8'}
  started = []
  for n, case_id in enumerate(SUBPROCESS_CASES):
    how, expected = next((h, e) for i, h, e in CASES if i == case_id)
    ctx = Ctx(str(tmp_path / case_id), monkeypatch)
    argv = argv_for(ctx, how)
    before = ctx.snapshot()
    entry = ([sys.executable, os.path.join(ROOT, 'scripts', 'train.py')] if n % 2 == 0 else
             [sys.executable, '-m', 'kernelformer', 'train'])
    proc = subprocess.Popen([*entry, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tempfile.gettempdir())
    started.append((case_id, expected, ctx, before, proc))
  for case_id, expected, ctx, before, proc in started:
    _, stderr = proc.communicate(timeout=300)
    try:
      check(proc.returncode, stderr, expected, before, ctx.snapshot())
    except AssertionError as e:
      raise AssertionError(f'{case_id}: {e}') from None


def test_free_space_demand_is_proportional_to_the_run(tmp_path, monkeypatch, no_training):
  """The tiny run (0.45 MB written) is not refused on a disk with 4 MiB free; a larger model or more
  kept checkpoints demand more (a flat 64 MiB was once demanded)."""
  from configs import listops  # pylint: disable=g-import-not-at-top
  c = listops.get_config('tiny')
  need = validate.checkpoint_bytes_needed(c)
  assert need < (4 << 20)
  with c.unlocked():
    c.keep_checkpoints = 10
  assert validate.checkpoint_bytes_needed(c) > need
  assert validate.checkpoint_bytes_needed(listops.get_config('quick')) > need
  ctx = Ctx(str(tmp_path), monkeypatch)
  _disk_full(4 << 20)(ctx)
  _reset_absl()
  with pytest.raises(ReachedTraining):
    try:
      kernelformer_cli.main(['train', *argv_for(ctx, ())])
    finally:
      _reset_absl()
      flags.FLAGS.mark_as_parsed()
