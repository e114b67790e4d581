"""Transports that hand a claimed job to its receiver: one async ``deliver`` each, with a fake beside them."""
