"""A training process for the signal and watchdog tests: scripts/train.py's error handling, tiny ListOps.

  python tests/training/signal_driver.py WORKDIR DATA_DIR [--step_sleep S] [--hang_at STEP]
      [--config.FIELD=VALUE ...]

Runs ``trainer.train_and_evaluate`` under ``cli.main_with_clean_errors`` (so exit codes and the last
stderr line are the CLI's) and prints ``step N`` on stdout after every step (and ``compiling`` when the train step's
compilation starts), so a test can time a signal. ``--step_sleep`` sleeps in a hook after each step (slows the run, changes no number).
``--hang_at`` makes the train step itself block (a host callback inside the compiled step that sleeps
for an hour) when it runs step ``hang_at``: a hung XLA call, for the watchdog test.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('workdir')
  parser.add_argument('data_dir')
  parser.add_argument('--step_sleep', type=float, default=0.0)
  parser.add_argument('--hang_at', type=int, default=0)
  args, overrides = parser.parse_known_args()

  from kernelformer.training import cli  # pylint: disable=g-import-not-at-top
  # Everything else happens inside main_with_clean_errors, as in scripts/train.py (an early signal
  # then ends the process with the CLI's one line, not a traceback).

  def run(_):
    import jax  # pylint: disable=g-import-not-at-top
    jax.config.update('jax_default_matmul_precision', 'highest')
    # 'compiling' on stdout when the train step's ahead-of-time compilation starts (the trainer's only
    # Lowered.compile call), so a test can signal during it.
    compile_ = jax.stages.Lowered.compile

    def announced_compile(self, *a, **k):
      print('compiling', flush=True)
      return compile_(self, *a, **k)
    jax.stages.Lowered.compile = announced_compile
    from kernelformer.training import steps as steps_lib  # pylint: disable=g-import-not-at-top
    from kernelformer.training import trainer  # pylint: disable=g-import-not-at-top
    from tests.training import helpers  # pylint: disable=g-import-not-at-top
    values = {}
    for o in overrides:
      key, value = o.removeprefix('--config.').split('=', 1)
      values[key] = eval(value, {})  # pylint: disable=eval-used  (test-only driver, literal values)
    config = helpers.tiny_config(args.data_dir, **values)
    if args.hang_at:
      make_steps = steps_lib.make_steps

      def hanging_make_steps(*a, **k):
        train_step, eval_step = make_steps(*a, **k)

        def block(step):
          if int(step) + 1 == args.hang_at:
            time.sleep(3600)

        def step_fn(state, batch):
          jax.debug.callback(block, state.step)
          return train_step(state, batch)
        return step_fn, eval_step
      steps_lib.make_steps = hanging_make_steps

    def report(step, state):
      del state
      print(f'step {step}', flush=True)
      if args.step_sleep:
        time.sleep(args.step_sleep)

    results = trainer.train_and_evaluate(config, args.workdir, hooks=[report])
    print(f"done {getattr(results, 'status', '')} {results['final_step']}", flush=True)

  sys.argv = sys.argv[:1]  # absl's app.run (inside main_with_clean_errors) parses no flags of ours
  cli.main_with_clean_errors(run)


if __name__ == '__main__':
  main()
