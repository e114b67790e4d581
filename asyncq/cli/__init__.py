"""The operator's command line (``asyncq …``): parsing, commands, output. It talks to the facades."""
