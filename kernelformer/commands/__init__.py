"""The subcommands of the ``kernelformer`` command (``kernelformer/cli.py``), one module each.

Each module has a docstring that is its ``--help`` text and a ``run(args) -> int`` entry point. Those
built on absl flags (train, sweep, report, kernels, config) define their flags at import, so the
dispatcher imports only the chosen one; prepare-data and benchmark keep their argparse parsers.
``scripts/*.py`` are thin aliases of these modules.
"""
from __future__ import annotations

# name -> (module under kernelformer.commands, one-line summary); the order of ``kernelformer --help``.
COMMANDS = {
    'train': ('train', 'train and evaluate one config (FILE.py[:PRESET] plus --config.FIELD=VALUE overrides)'),
    'sweep': ('sweep', 'run a grid of overrides, or a named sweep, one resumable run per point'),
    'report': ('report', 'tables and a plot of a sweep directory: mean ± std over seeds, paper numbers'),
    'prepare-data': ('prepare_data', "get each LRA task's data where its config looks, or --check it"),
    'reproduce': ('reproduce', 'a published measurement that is not a training table (Skyformer\'s instability ratios)'),
    'benchmark': ('benchmark', 'attention cost vs length, approximation quality, or loader speed'),
    'kernels': ('kernels', 'every attention kernel: aliases, paper and equation, options and defaults'),
    'config': ('config', "print a resolved config (FILE.py:PRESET with overrides) or a task's presets"),
}
