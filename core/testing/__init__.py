"""Test helpers that ship with ddl: a thread-backed fake communicator and the schedule checker."""

from ddl.testing.engines import run_engines
from ddl.testing.fake_comm import FakeAbort, FakeComm, run_ranks
from ddl.testing.symbolic import ScheduleError, check_algorithm, check_schedules

__all__ = ["FakeAbort", "FakeComm", "ScheduleError", "check_algorithm", "check_schedules", "run_engines", "run_ranks"]
