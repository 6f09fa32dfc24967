"""Test setup: 8 forced CPU devices (sharding tests), float32 matmuls at full precision, absl parsed."""
import os

# Must happen before jax is imported anywhere: lets the sharding tests build an 8-device mesh on CPU.
# The other flags make XLA:CPU compile fast rather than run fast: test shapes are tiny, so compilation
# dominates (about 2.5x less CPU for the attention tests), and they change no numerics we assert on.
# Flags already in XLA_FLAGS are kept and win over these (e.g. XLA_FLAGS=--xla_cpu_max_isa=AVX2 runs the
# suite as on an AVX2 CPU, with the 8 devices still forced).
_XLA_DEFAULTS = {
    '--xla_force_host_platform_device_count': '8',
    '--xla_backend_optimization_level': '0',
    '--xla_llvm_disable_expensive_passes': 'true',
    '--xla_cpu_use_fusion_emitters': 'false',
}
_given = os.environ.get('XLA_FLAGS', '').split()
os.environ['XLA_FLAGS'] = ' '.join(
    [f'{k}={v}' for k, v in _XLA_DEFAULTS.items() if not any(g.split('=')[0] == k for g in _given)]
    + _given)
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# A test that leaves config.data.data_dir at its default writes into a throw-away folder, never into
# the user's ~/.cache/kernelformer/data (kernelformer/data_location.py); subprocesses inherit it.
if 'KERNELFORMER_DATA' not in os.environ:
  import atexit  # noqa: E402
  import shutil  # noqa: E402
  import tempfile  # noqa: E402
  os.environ['KERNELFORMER_DATA'] = tempfile.mkdtemp(prefix='kernelformer-test-data-')
  atexit.register(shutil.rmtree, os.environ['KERNELFORMER_DATA'], True)

# One persistent XLA compilation cache for the whole run: the test processes (xdist workers) and the
# subprocesses they start (inherited like KERNELFORMER_DATA). A program that another test already
# compiled -- the same tiny model, trained by many end-to-end tests, in-process or as a CLI run -- loads
# instead of compiling (about half of a tiny CLI run's 10 s; a quarter of the trainer tests' time). A hit
# loads the very executable a compile would produce (the key covers the program, XLA_FLAGS and the
# backend), so no number a test asserts on can change. The kernel-level tests are the exception
# (``_compilation_cache`` below): each compiles programs of its own, so a key would only cost. A test
# about compilation itself turns it off in its subprocess (JAX_ENABLE_COMPILATION_CACHE=false).
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  import atexit  # noqa: E402
  import shutil  # noqa: E402
  import tempfile  # noqa: E402
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='kernelformer-test-xla-cache-')
  atexit.register(shutil.rmtree, os.environ['JAX_COMPILATION_CACHE_DIR'], True)
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update('jax_default_matmul_precision', 'highest')

from absl import flags  # noqa: E402

# grain and our scripts read absl flags; tests never parse a command line.
if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()


# The test command (README, .ci/run) is ``python -m pytest -n 2 -q``: every test, these included. The
# markers below only select: ``-m "not slow"`` for a shorter local run, ``-m isa`` for the numerics
# subset that .ci/run repeats under narrower vector ISAs.
#
# ``slow``: the end-to-end tests that take longest on 2 cores (pytest --durations: each 4-70 s).
# Matched by test function name.
SLOW_TESTS = frozenset({
    # The slowest single tests otherwise, 4-11 s each (pytest --durations).
    'test_three_members_equal_their_single_runs',
    'test_eight_members_first_middle_last',
    'test_dry_run_lists_jobs_without_a_scheduler',
    'test_bfloat16_computes_in_bfloat16',
    'test_chunked_projection_equals_whole',
    'test_unrolled_parameter_names_unchanged',
    'test_weight_decay_mask_by_parameter_kind',
    'test_slurm_sweep_cancel_preempt_resubmit_equals_local',
    'test_random_interruption_chain_resumes_bitwise',
    'test_dry_run_passes_and_reports_every_section',
    'test_two_processes_equal_one_process_with_two_devices',
    'test_doc_commands_train_sweep_and_report_a_plugin_kernel',
    'test_remat_variants_equal_the_plain_model',
    'test_four_layer_models_with_lapack_samplers_finish',
    'test_resumed_run_equals_uninterrupted',
    'test_profile_steps_writes_a_trace',
    'test_bfloat16_losses_match_float32',
    'test_blocks_with_carried_state_equal_full_forward',
    'test_a_killed_process_stops_the_survivor_within_seconds',
    'test_benchmark_compare_official_quick',
    'test_benchmark_compare_projections_quick',
    'test_benchmark_quick',
    'test_approximation_quick',
    'test_watchdog_stops_a_hung_step',
    'test_second_sigint_during_a_checkpoint_write_stops_once_it_is_complete',
    'test_trained_model_bpb_improves_disjoint_sliding_stateful',
    'test_train_cli_tiny_reports_bits_per_byte',
    'test_one_device_and_eight_devices_agree',
    'test_cli_dry_run_emit_and_parallel_failures',
    'test_bad_inputs_real_processes',
    'test_train_step_benchmark_reports_reuse_and_redraw_steps',
    'test_workdir_belongs_to_one_config_and_finished_runs_are_finished',
    'test_test_measures_the_best_checkpoint_or_stops',
    'test_no_silent_restart_when_no_checkpoint_restores',
    'test_stateful_equals_full_forward_over_the_whole_text_and_disjoint_within_one_window',
    'test_query_only_logits_same_loss_and_gradient_as_full_logits_masked',
    'test_nonfinite_loss_stops_at_the_exact_step_and_leaves_the_workdir_as_it_was',
    'test_incremental_equals_full_forward_two_layers',
    'test_resume_after_damage_and_crash_has_no_duplicate_events',
    'test_train_and_evaluate_on_fixtures',
    'test_scanned_layers_draw_independent_features_and_train',
    'test_error_after_a_resume_leaves_the_record',
    'test_file_size_limit_ends_in_one_line',
    'test_gradient_reaches_only_the_map_and_the_step_adds_and_logs_it',
    'test_gradient_accumulation_carries_the_aux_loss',
    # Runs ending cleanly and the record of a finished run kept (tests/training/test_clean_exit.py,
    # test_run_record.py): whole CLI runs and trainer runs, 20-100 s each on 2 cores.
    'test_finished_runs_exit_0',
    'test_a_checkpoint_that_does_not_restore_ends_in_its_one_line',
    'test_a_returned_run_leaves_no_thread_and_no_live_run',
    'test_a_started_run_whose_checkpoints_are_gone_is_refused',
    'test_a_stretch_that_diverges_leaves_the_finished_run_as_it_was',
    'test_a_write_failure_at_the_end_of_a_stretch_leaves_the_finished_run',
    'test_a_diverging_skip_run_is_not_advised_to_skip',
})


# The registry-wide properties (one test per registered kind, 85 kinds and growing) are ``slow`` for the
# rest of the component x weight-sampler grid only: ``-m "not slow"`` keeps one sampler of every
# component (orf; grelu: iid and orf as performer-relu) and every sampler of posrf, so each component
# and each sampler is still checked; likewise one kind of each deterministic map family.
REGISTRY_SUITES = frozenset({
    'test_incremental_equals_full_forward',                # tests/test_decoder.py
    'test_identical_documents_give_identical_embeddings',  # tests/test_encoder_dual.py
    'test_same_real_outputs_padded_to_l_or_4l',            # tests/attention/test_padding_invariance.py
    'test_padding_invariance_and_finite_edge_cases',       # tests/attention/test_masking_all.py
    'test_single_valid_key',                               # tests/attention/test_degenerate_rows.py
})
GRID_COMPONENTS_IN_SECOND_COMMAND = ('trigrf', 'rks', 'hyperbolic', 'oprf', 'saderf', 'grelu')
GRID_KINDS_IN_FIRST_COMMAND = frozenset({'trigrf-orf', 'rks-orf', 'hyperbolic-orf',
                                         'oprf-orf', 'saderf-orf', 'grelu-iid'})
# Variants of a deterministic map whose family stays in the first command (dpfp; relu, squared-relu and
# linear-elu for the elementwise maps; polysketch for its learned form).
MAP_VARIANTS_IN_SECOND_COMMAND = frozenset({'dpfp-nu2', 'dpfp-nu3', 'gelu', 'swish', 'sigmoid', 'square',
                                            'identity', 'polysketch-learned'})


def grid_kind_in_second_command(kind: str) -> bool:
  """A kind whose registry-suite tests are ``slow`` (named for the two-command layout it came from)."""
  if kind in MAP_VARIANTS_IN_SECOND_COMMAND:
    return True
  component = kind.split('-', 1)[0]
  return (component in GRID_COMPONENTS_IN_SECOND_COMMAND and '-' in kind
          and kind not in GRID_KINDS_IN_FIRST_COMMAND)


# ``isa``: tests that compare two differently fused float32 computations (or a float32 computation with
# a float64 reference) at a tolerance the math must justify. How XLA:CPU vectorises and fuses depends on
# the CPU's vector ISA, so a tolerance fitted to one machine can fail on another (AVX-512 vs AVX2 vs
# SSE4.2). .ci/run runs this subset again under XLA_FLAGS=--xla_cpu_max_isa=AVX2 and =SSE4_2; locally:
#   XLA_FLAGS=--xla_cpu_max_isa=SSE4_2 python -m pytest -n 2 -q -m isa
# Matched by file (relative to tests/).
# Kept small (about 110 tests): the files whose tight comparisons are between two fusions of the same
# float32 math (cached vs in-program draws, lean vs stored feature paths, structured vs dense
# projections, fused vs reference softmax); the registry-wide suites stay at the native ISA only.
ISA_FILES = frozenset({
    'attention/test_projection_cache.py',
    'attention/test_softmax.py',
    'attention/test_linear_lean.py',
    'attention/test_causal_lean.py',
    'features/test_weights.py',
    'features/test_hadamard.py',
})


_cache_state = {'on': None}


def _use_compilation_cache(on: bool) -> None:
  if _cache_state['on'] is not on:
    from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
    jax.config.update('jax_enable_compilation_cache', on)
    compilation_cache.reset_cache()       # jax decides whether to use the cache once, until reset
    _cache_state['on'] = on


# Tests that compile programs no other test compiles: the kernel-level directories and the
# registry-wide suites. Measured (single process, back to back): the trainer tests of
# training/test_run_record.py, test_trainer.py and test_selection.py 100 s -> 77 s with the cache; the
# kernel-level files 0-20 % slower with it.
_DISTINCT_PROGRAM_DIRS = ('attention', 'features', 'pallas')


@pytest.fixture(autouse=True)
def _compilation_cache(request):
  """The persistent cache in this process, except where every program is distinct."""
  folder = os.path.relpath(str(request.node.path), os.path.dirname(os.path.abspath(__file__)))
  distinct = (folder.split(os.sep)[0] in _DISTINCT_PROGRAM_DIRS
              or getattr(request.node, 'originalname', request.node.name) in REGISTRY_SUITES)
  _use_compilation_cache(not distinct)
  yield


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  tests_dir = os.path.dirname(os.path.abspath(__file__))
  for item in items:
    if os.path.relpath(str(item.path), tests_dir).replace(os.sep, '/') in ISA_FILES:
      item.add_marker(pytest.mark.isa)
    name = getattr(item, 'originalname', item.name)
    if name in SLOW_TESTS:
      item.add_marker(pytest.mark.slow)
    elif name in REGISTRY_SUITES:
      params = getattr(getattr(item, 'callspec', None), 'params', {})
      kind = params.get('kind', params.get('name'))
      if isinstance(kind, str) and grid_kind_in_second_command(kind):
        item.add_marker(pytest.mark.slow)
