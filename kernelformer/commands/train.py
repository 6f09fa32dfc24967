"""kernelformer train: train and evaluate one config; re-running with the same --workdir resumes.

usage:
  kernelformer train --config FILE.py[:PRESET] --workdir DIR [--config.FIELD=VALUE ...]

examples:
  kernelformer train --config configs/listops.py:quick --workdir runs/listops_quick
  kernelformer train --config listops:quick --workdir runs/favor \\
      --config.model.attention.kind=posrf-orf --config.model.attention.num_features=64
  kernelformer train --config listops:tiny --workdir runs/mine \\
      --config.model.attention.plugin=my_kernels.py --config.model.attention.kind=mine-orf
  kernelformer train --config listops:tiny --workdir runs/pop \\
      --config.population="({'seed': 0}, {'seed': 1})"   # one program: runs/pop/seed=0, runs/pop/seed=1

A run writes checkpoints/, best/, metrics.jsonl, tensorboard/ and results.json into --workdir (README,
"Resuming, outputs, results"). The work is kernelformer.training.train_and_evaluate; multi-host: README
("Scaling up"). Print a resolved config without training: kernelformer config FILE.py:PRESET [overrides].
"""
from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from kernelformer.commands import _common
from kernelformer.training import cli as training_cli

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Task config FILE.py[:PRESET] (a path, or a packaged name like listops:quick); '
    'override any field with --config.FIELD=VALUE.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, logs and results.json.')
training_cli.define_distributed_flags()
flags.mark_flags_as_required(['config', 'workdir'])


def _main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  training_cli.run(lambda: _CONFIG.value, _WORKDIR.value)


def fields_text() -> str:
  """The config fields, grouped, from the first packaged task config (every task has the same groups)."""
  import importlib  # pylint: disable=g-import-not-at-top
  config = None
  for task in _common.task_names():
    try:
      config = importlib.import_module(f'kernelformer.configs.{task}').get_config()
      break
    except Exception:  # pylint: disable=broad-except  (help must not fail on one broken file)
      continue
  if config is None:
    return 'config fields: (no packaged config could be loaded)'
  groups: dict[str, list[str]] = {}

  def walk(node, prefix):
    for key in node.keys():
      value = node[key]
      if hasattr(value, 'keys'):
        walk(value, f'{prefix}{key}.')
      else:
        groups.setdefault(prefix, []).append(key)
  walk(config, '')
  lines = ['config fields (--config.FIELD=VALUE; types and values: kernelformer config TASK:PRESET):']
  for prefix, keys in groups.items():
    lines.append(_common.wrap(f'{prefix or "(top level)"}{"*" if prefix else ""}: {" ".join(keys)}'))
  lines.append('  data.* has task-specific fields too (kernelformer config TASK).')
  return '\n'.join(lines)


def help_text() -> str:
  return _common.absl_help(
      sys.modules[__name__], ['kernelformer.training.cli'],
      lambda: '\n\n'.join([_common.presets_text(), fields_text(), _common.kernels_text()]))


def run(args) -> int:
  if not _common.wants_help(args):
    args = _common.resolve_config_args(args)
  return _common.run_absl(sys.modules[__name__], 'kernelformer train', args, _main, help_text,
                          runner=training_cli.main_with_clean_errors)
