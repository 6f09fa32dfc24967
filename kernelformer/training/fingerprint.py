"""What makes two runs the same run: a config fingerprint, and a digest of a checkpointed state.

A workdir belongs to one config. ``config_fields`` flattens a config to ``{'model.attention.kind': ...}``
minus the fields that cannot change what a run computes (``EXCLUDED``, each with its reason); the
fingerprint is a SHA-256 of that dict. A later run whose fields differ is refused before anything is
compiled (``kernelformer.training.record``), naming the differing fields.

``tree_digest`` hashes a state's arrays (paths, shapes, dtypes and bytes), stored in each checkpoint's
meta so that a restore can tell a bit-flipped checkpoint from a good one; ``tree_structure`` hashes the
shapes only, so that a checkpoint of another model is refused rather than taken for damage.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from kernelformer import run_config

# numpy and jax are imported where they are used: the config fingerprint (and the workdir and signal
# modules that use it) must load in a moment, before a training process imports jax (a Ctrl-C while
# jax loads is handled by kernelformer.training.signals).

# Config fields that do not change what a run computes (its parameters, metrics and test result), with
# why. Everything else (task, data, model, attention, optimizer, schedule, seed, batch sizes, steps,
# evaluation frequency and cap, divergence policy) is in the fingerprint.
EXCLUDED: dict[str, str] = {
    'progress': 'the progress bar is display only',
    'log_every': 'how often training metrics are averaged and logged; the trained state is the same',
    'profile_steps': 'a profiler trace observes steps, it does not change them',
    'checkpoint_every': 'where resume points are; batches and RNG keys are functions of the step, so '
                        'resuming from any step gives the same run',
    'keep_checkpoints': 'how many resume points are kept on disk',
    'data.data_dir': "where the files are, not what they are (the other data fields fix the content); "
                     'a data directory may move',
    'data.tfds_data_dir': 'where TFDS keeps its files, as data.data_dir',
    'data.tfds_check': 'whether to check the TFDS files before starting',
    'data.generate': 'whether missing generated files may be made; the generator fields fix the content',
    'model.attention.impl': 'which implementation (fused Pallas or XLA) computes the same mathematics; a '
                            'run may move between a GPU and a CPU',
    'model.attention.implementation': 'as model.attention.impl, for softmax (cuDNN or XLA)',
    'allow_config_change': 'the override itself (recorded in run.json and results.json)',
    'reevaluate': 'asks a finished run to re-test; the trained state is the same',
    'population': "a population's members; each member's workdir records its own config, without it",
    'start_over': 'allows a workdir whose checkpoints are all damaged to train again from step 0',
    'watchdog_step_s': 'a time limit on a hung step; a run that finishes computed the same',
    'watchdog_compile_s': 'a time limit on a hung compilation, as watchdog_step_s',
}


KIND = 'model.attention.kind'


def canonical_kind(kind: Any) -> Any:
  """The registry's name for an attention ``kind`` (aliases resolved); others (a plugin's kind that is
  not loaded, a non-string) as given."""
  if not isinstance(kind, str) or not kind:
    return kind
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  try:
    return registry.canonical_name(kind)
  except registry.UnknownKernelError:
    return kind


def config_fields(config: Any, *, without: tuple[str, ...] = ()) -> dict[str, Any]:
  """Flat ``{'dotted.name': value}`` of ``config`` (a ConfigDict or dict, nested fields included) without
  the ``EXCLUDED`` fields (and the dotted names in ``without``), the attention kind by its canonical
  name. The one definition of "the same run": the workdir's record (``record.RunRecord``) and the
  report's grouping of seeds (``reproduce.report``, ``without=('seed',)``) both use it."""
  d = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
  out: dict[str, Any] = {}

  def walk(prefix: str, node: Mapping) -> None:
    for k in sorted(node):
      name = f'{prefix}{k}'
      v = node[k]
      if isinstance(v, Mapping):
        walk(name + '.', v)
      elif name not in EXCLUDED and name not in without:
        out[name] = _jsonable(v)

  walk('', d)
  if KIND in out:
    out[KIND] = canonical_kind(out[KIND])
  return out


def _jsonable(v: Any) -> Any:
  if isinstance(v, (tuple, list)):
    return [_jsonable(x) for x in v]
  if type(v).__module__ == 'numpy' and getattr(v, 'shape', None) == ():   # numpy scalars
    return v.item()
  if v is None or isinstance(v, (bool, int, float, str)):
    return v
  return str(v)


def digest(fields: Mapping[str, Any]) -> str:
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


# Fields added to the configs after runs were recorded: their absence means one value, the behaviour of
# every earlier run (``run_config.legacy``, the record's defaults), so a resume whose config sets another
# value is a difference, not a new field.
ADDED_FIELDS: dict[str, Any] = {name: run_config.legacy(name) for name in (
    'optim.decay_mask', 'model.short_conv', 'model.state_mixer', 'data.query_targets',
    'data.eval_context', 'data.eval_stride', 'early_stop_accuracy', 'data.pixel_padding',
    'model.qkv_bias', 'model.retrieval_head', 'optim.grad_clip_value', 'eval.test_checkpoint',
    'model.param_init', 'model.layer_norm_eps', 'model.gelu_approximate')}


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
  """``['model.attention.kind: posrf-orf -> softmax', ...]`` for every field that differs.

  Fields the recorded run did not have (added to the configs since) are not differences: that run
  could not have set them -- except those in ``ADDED_FIELDS``, whose absence means a known value.
  """
  if KIND in old:   # records written before kinds were canonicalised may hold an alias
    old = {**old, KIND: canonical_kind(old[KIND])}
  out = []
  for k in sorted(set(old) | (set(ADDED_FIELDS) & set(new))):
    a, b = old.get(k, ADDED_FIELDS.get(k, '<absent>')), new.get(k, '<absent>')
    if a != b:
      out.append(f'{k}: {a} -> {b}')
  return out


def _leaves_with_paths(tree: Any):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree_util.tree_flatten_with_path(tree)[0]


def tree_structure(tree: Any) -> str:
  """A hash of the paths, shapes and dtypes of ``tree``'s leaves (arrays or ShapeDtypeStructs)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  h = hashlib.sha256()
  for path, x in _leaves_with_paths(tree):
    h.update(f'{jax.tree_util.keystr(path)}:{tuple(x.shape)}:{np.dtype(x.dtype).name};'.encode())
  return h.hexdigest()


def _host_array(x: Any):
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  # A replicated array's first addressable shard is the whole array, on every process.
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    x = x.addressable_data(0)
  return np.asarray(jax.device_get(x))


def tree_digest(tree: Any) -> str:
  """SHA-256 of ``tree``'s leaves' paths, shapes, dtypes and bytes (the state must be replicated)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  h = hashlib.sha256()
  for path, x in _leaves_with_paths(tree):
    a = np.ascontiguousarray(_host_array(x))
    h.update(f'{jax.tree_util.keystr(path)}:{a.shape}:{a.dtype.name};'.encode())
    h.update(a.tobytes())
  return h.hexdigest()
