"""The end of a run: the test of the selected checkpoint and results.json with the run's record."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from typing import Optional

import jax
import numpy as np

from kernelformer import plugins
from kernelformer.training import checkpoint as ckpt_lib
from kernelformer.training import lm_eval
from kernelformer.training import record as record_lib
from kernelformer.training import selection
from kernelformer.training import workdir as workdir_lib
from kernelformer.training.run_meta import Journal, RunMeta, RunResults, Segment, Setup
from kernelformer.training.steps import TrainState, count_params, evaluate


@dataclasses.dataclass(frozen=True)
class Tested:
  """The test's loss, accuracy and examples, the checkpoint tested (``{'which': 'best' | 'final',
  'step', 'rule'}``) and its meta (None: the final state's)."""
  result: dict
  checkpoint: dict
  meta: Optional[dict]


def test(setup: Setup, meta: RunMeta, state: TrainState, segment: Segment) -> Tested:
  """Test loss and accuracy of the selected checkpoint on the whole test split. If the newest best/
  does not restore, the earlier one is tested and named; if none does, the run stops with one line."""
  best, tested_meta = setup.best, None
  rule = setup.run.eval.test_checkpoint
  checkpoint = {'which': 'final', 'step': int(state.step), 'rule': rule}
  if selection.tests_best(rule) and (best.all_steps() or best.damaged()):
    restored = best.restore_latest(ckpt_lib.abstract_like(state))
    if restored is None:
      raise workdir_lib.RunError(
          f"best/ in {setup.workdir} holds no checkpoint that restores ({', '.join(best.damaged())}"
          f'); the test was not run and results.json is unchanged; put best/ back from a copy, or '
          f'train again in a new --workdir')
    state, tested_meta = restored
    checkpoint = {'which': 'best', 'step': int(best.latest_step()), 'rule': rule}
    if checkpoint['step'] != meta.best_step:
      workdir_lib.say(f"testing best/{checkpoint['step']} (validation accuracy "
                      f"{tested_meta.get('best_val_accuracy')}): the newest best/ that "
                      f'restores; best/{meta.best_step} did not')
  test_source = setup.task.source(setup.run.data, 'test')
  on_batch = setup.watch.eval_progress(f"testing the {checkpoint['which']} checkpoint")
  if lm_eval.is_stateful(setup.run):   # enwik8: windows in order, the decoder's state carried
    result = lm_eval.evaluate_stateful(
        setup.model, {'params': state.params, **state.model_state}, test_source,
        features_key=setup.features_key, on_batch=on_batch)
  else:
    result = evaluate(setup.eval_step, state, test_source, setup.run, setup.mesh, max_batches=0,
                      on_batch=on_batch)
  setup.watch.disarm()
  if setup.stop.requested:
    raise setup.stop.stop_error(segment.last_saved, setup.workdir)
  return Tested(result=result, checkpoint=checkpoint, meta=tested_meta)


def finish(setup: Setup, meta: RunMeta, segment: Segment, journal: Journal, state: TrainState,
           tested: Tested) -> RunResults:
  """Writes the test event and results.json with the rest of the run's record (``record_lib.new_record``)."""
  with record_lib.new_record(setup.workdir) if setup.is_lead else contextlib.nullcontext() as staged:
    results = write_results(setup, meta, segment, journal, state, tested, staged)
    journal.close()
    setup.checkpoints.close()
    setup.best.close()
    if staged and setup.prior.provisional:
      shutil.copytree(setup.best.directory, os.path.join(staged, 'best'), copy_function=os.link)
  out = RunResults(results)
  out.status = ('reevaluated' if segment.start_step == setup.num_steps and setup.prior.provisional
                else 'trained')
  return out


def write_results(setup: Setup, meta: RunMeta, segment: Segment, journal: Journal,
                  state: TrainState, tested: Tested, staged: Optional[str]) -> dict:
  config, run, test_result = setup.config, setup.run, tested.result
  journal.commit(staged)
  journal.write('test', tested.checkpoint['step'], test_result)
  cap = run.max_eval_batches
  selected = tested.meta if tested.meta else {'best_val_accuracy': meta.best_val_accuracy,
                                              'best_step': meta.best_step}
  results = {
      'task': run.data.task,
      'attention': run.model.attention.spec.name,  # aliases resolved
      'plugins': plugins.provenance(config.model.attention),  # [{file, sha256}] of user kernel code
      'test_accuracy': test_result['accuracy'],
      'test_loss': test_result['loss'],
      'test_examples': test_result['examples'],
      'tested_checkpoint': tested.checkpoint,   # {'which': 'best' | 'final', 'step', 'rule'}
      'best_val_accuracy': selected['best_val_accuracy'],
      'best_step': selected['best_step'],
      'selected_on': (f"validation accuracy every {run.eval_every} steps over "
                      f"{meta.val_examples} examples" +
                      (f' (periodic validation capped at max_eval_batches={cap})' if cap
                       else ' (the whole validation split)')),
      'final_step': int(state.step),
      'stopped_early': meta.stopped_early,   # {step, val_accuracy, threshold} or None
      'num_params': count_params(state.params),
      'steps_per_sec': (meta.timed_steps / meta.train_seconds if meta.timed_steps else 0.0),
      'steps_trained': meta.steps_trained,
      'train_seconds': meta.train_seconds,
      'wall_time_s': segment.wall_seconds(meta),
      'started': meta.started,
      'finished': workdir_lib.now_iso(),
      'compiled_memory_bytes': meta.compiled_memory_bytes,
      'num_devices': int(setup.mesh.devices.size),
      'num_processes': jax.process_count(),
      'backend': jax.default_backend(),
      'code_version': workdir_lib.code_version(),
      'code_versions': meta.code_versions,   # one entry per code that trained (code_segments)
      'data_order': meta.data_order,   # one entry per data order (input_pipeline.DATA_ORDER)
      'config_fingerprint': setup.prior.record.fingerprint,
      'config_changes': setup.prior.record.changes,
      'config': config.to_dict(),
  }
  if getattr(setup.info, 'metric', None) == 'bits_per_byte':
    # Byte-level LM (enwik8): mean next-byte cross-entropy in bits (nats / ln 2).
    results['test_bits_per_byte'] = test_result['loss'] / float(np.log(2.0))
    results.update(lm_eval.describe(run))   # the test's context scheme (eval_context, stride)
  journal.writer.write_results(results)
  return results
