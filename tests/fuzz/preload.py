"""Imported by the fuzz campaign's fork server before it forks any worker: see `worker.warm`."""

from tests.fuzz.worker import warm

warm()
