"""Stores: the port every layer above uses (``asyncq.store.port``) and the drivers that implement it."""
