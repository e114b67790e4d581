"""The PostgreSQL driver (asyncpg): the same store port as SQLite, the same conformance suite."""
