"""The exact lab contracts (``lease``, ``outbox``): thin validating shims over asyncq's shared rules."""
