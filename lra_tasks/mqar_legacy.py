"""This repository's MQAR before issue 22 (not Zoology's): defined in ``lra_tasks/mqar.py``; registered here."""
from lra_tasks.mqar import LEGACY as TASK  # noqa: F401
