"""Storage: schemas, named SQL statements, and the small code that opens files and runs transactions."""
