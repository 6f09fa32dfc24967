"""This repository's MQAR before it followed Zoology's generator (not Zoology's): defined in ``lra_tasks/mqar.py``; registered here."""
from lra_tasks.mqar import LEGACY as TASK  # noqa: F401
