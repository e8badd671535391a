"""The scheduler (pure Python): which requests run each step, and with how many tokens."""

from tokenmill.scheduler.config import SchedulerConfig
from tokenmill.scheduler.output import ScheduledRequest, SchedulerOutput
from tokenmill.scheduler.request_update import RequestUpdate
from tokenmill.scheduler.scheduler import Scheduler
from tokenmill.scheduler.stats import SchedulerStats

__all__ = ["RequestUpdate", "ScheduledRequest", "Scheduler", "SchedulerConfig", "SchedulerOutput", "SchedulerStats"]
