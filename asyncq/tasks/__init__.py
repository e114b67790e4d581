"""Tasks: typed async functions declared with ``@app.task``, deferred as jobs, run by ``app.run_worker``
(docs/tasks.md). Arguments and results are checked with pydantic v2."""

from asyncq.tasks.app import App, Dispatcher, Ran, TaskContext, TaskLogFilter, current
from asyncq.tasks.groups import TaskGroup
from asyncq.tasks.opening import open
from asyncq.tasks.results import TaskJob
from asyncq.tasks.task import Deferral, Task

__all__ = [
    "App",
    "Deferral",
    "Dispatcher",
    "Ran",
    "Task",
    "TaskContext",
    "TaskGroup",
    "TaskJob",
    "TaskLogFilter",
    "current",
    "open",
]
