"""Served over HTTP: the dashboard, Prometheus metrics, and the small aiohttp serving helper they share."""
