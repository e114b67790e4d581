"""What runs the jobs: the asyncio worker pool, what a handler sees, and what the pool reports.

``pool`` the batcher and the per-job path (one frame: the hot path); ``settings`` how a pool runs (one frozen value,
shared with the CLI); ``flight`` the jobs in flight and the buffer; ``leases`` renewal, loss, give-back;
``report`` counters, observer, log; ``supervision`` waiting out a busy store, idling, serving until a signal;
``results`` a handler's return value as kept; ``context`` what a handler gets; ``observer`` the hook metrics use.
"""
