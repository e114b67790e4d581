"""Served over HTTP: the operator's console (``asyncq.web.console``), Prometheus metrics, and the small aiohttp
serving helper they share."""
