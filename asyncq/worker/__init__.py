"""What runs the jobs: the asyncio worker pool, what a handler sees, and what the pool reports."""
