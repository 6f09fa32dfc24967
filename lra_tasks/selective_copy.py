"""Selective copy (Gu & Dao 2023): defined with MQAR in ``lra_tasks/mqar.py``; this module registers it."""
from lra_tasks.mqar import SELECTIVE_COPY as TASK  # noqa: F401
