"""Reproducing the papers' tables: sweep expansion and running, run directories, reports.

* ``sweeps``: a sweep is a list of points (task config, preset, overrides); each point trains in its own
  stable, readable work directory under the sweep directory, so re-running a sweep trains only what is
  missing (``scripts/sweep.py``).
* ``report``: reads a sweep directory back into a kernels x tasks table (mean +- std over seeds, the
  paper's printed number beside ours), a CSV and an accuracy-vs-speed plot (``scripts/report.py``).
* ``paper_numbers``: the accuracies the papers printed, with table and page, kept as data
  (``paper_numbers.csv``).
"""
