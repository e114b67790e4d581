"""The SQLite driver: schema, migrations, named statements, transactions and the asyncio seam."""
