"""``python -m asyncq``: the ``asyncq`` command."""

from asyncq.cli.main import main

raise SystemExit(main())
