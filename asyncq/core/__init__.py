"""Pure rules: value checks, backoff and the job lifecycle. No I/O, no asyncio."""
