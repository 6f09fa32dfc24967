"""Train and evaluate one config: flags only; the work is kernelformer.training.train_and_evaluate.

  python scripts/train.py --config configs/listops.py:quick --workdir runs/listops_quick
  python scripts/train.py --config configs/listops.py:quick --workdir runs/x \\
      --config.model.attention.kind=posrf-orf --config.model.attention.num_features=64

Re-running with the same --workdir resumes from its last checkpoint. Multi-host: see README ("Scaling up").
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from kernelformer.training import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Task config: FILE.py[:PRESET].',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, logs and results.json.')
cli.define_distributed_flags()
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  cli.run(lambda: _CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
  cli.main_with_clean_errors(main)
