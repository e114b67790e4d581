"""Every limit a caller can hit, named once: the product's (``Queue``, ``Pool``, ``RetryPolicy``, the CLI) and the
lab contracts' (``asyncq.lab``), which are narrower because the labs' specs say so. ``docs/limits.md`` is the
same table for people. Durations are milliseconds here; the public API takes seconds and converts."""

from __future__ import annotations

SECOND_MS = 1000
DAY_MS = 24 * 3600 * SECOND_MS

# -- the product ---------------------------------------------------------------------------------------------
DEFAULT_QUEUE = "default"
MAX_BODY_BYTES = 64 * 1024  # a job's body as canonical JSON
MAX_ATTEMPTS = 1000  # a job's attempt budget
DEFAULT_MAX_ATTEMPTS = 3
MAX_TTL_MS = 365 * DAY_MS  # from enqueue to the deadline; a delay must fit inside it
DEFAULT_TTL_MS = DAY_MS
MAX_LEASE_MS = DAY_MS
MIN_LEASE_MS = 4  # the pool renews at a quarter of the lease
DEFAULT_LEASE_MS = 30 * SECOND_MS
MAX_BATCH = 1000  # jobs in one claim, one listing page, one enqueue_many call's statement batch
MAX_CONCURRENCY = 1000  # a pool's worker tasks
MAX_RETRY_BASE_MS = 3600 * SECOND_MS  # a retry policy's first delay
MAX_RETRY_CAP_MS = 7 * DAY_MS  # a retry policy's longest delay (a day and more, as production queues allow)
DEFAULT_RETRY_BASE_MS = SECOND_MS
DEFAULT_RETRY_CAP_MS = 60 * SECOND_MS
MIN_POLL_SECONDS = 0.001  # an idle pool's shortest poll: 0 would spin a core
MAX_POLL_SECONDS = 3600.0
MAX_JOB_TIMEOUT_SECONDS = MAX_LEASE_MS / SECOND_MS * 365  # a handler's own timeout (renewed leases cover it)
MAX_BUSY_TIMEOUT_SECONDS = 3600.0  # how long a store call waits for another writer's lock
MAX_NOTE_CHARS = 500  # an operator's note (redrive, cancel, pause, resume): printable free text
MIN_PRIORITY = -100  # a job's priority: higher is claimed first
MAX_PRIORITY = 100
DEFAULT_PRIORITY = 0
MAX_UNIQUE_KEY_CHARS = 200  # a job's unique key: printable text
MAX_TASK_NAME_CHARS = 200  # a task's name (@app.task), stored on its jobs' rows: printable text
MAX_WAIT_MS = 365 * DAY_MS  # a queue's max_wait: a job ready this long is served before higher priorities
MAX_DEPENDENCIES = 1000  # the jobs one job waits for (``after=[…]``)
MAX_GROUP_NAME_CHARS = 58  # a group's name: an identifier short enough for its callback's id (``group-NAME``)
MAX_LIMIT_KEY_CHARS = 200  # a job's limit key (a tenant, an account): printable text
MAX_LIMIT_SLOTS = 100_000  # a queue's (or a limit key's) concurrency limit: leases live at once
MAX_RATE = 1_000_000  # a queue's rate limit: jobs started per ``per``
MIN_RATE_PER_MS = 1  # a rate's period: 1 ms … 365 days
MAX_RATE_PER_MS = 365 * DAY_MS
DEFAULT_RATE_PER_MS = SECOND_MS

# -- the lab contracts (asyncq.lab.lease, asyncq.lab.outbox) ---------------------------------------------------
LAB_MAX_TTL_MS = 60 * SECOND_MS
LAB_MAX_LEASE_MS = 60 * SECOND_MS
LAB_MAX_DELAY_MS = 60 * SECOND_MS
LAB_MAX_ATTEMPTS = 16
LAB_MAX_QTY = 1000
LAB_RETRY_MAX_MS = 60 * SECOND_MS  # retry_delay's base and cap
LAB_RETRY_BASE_MS = 100  # run_once's policy
LAB_RETRY_CAP_MS = 1000
