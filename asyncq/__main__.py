"""``python -m asyncq``: the ``asyncq`` command."""

from asyncq.cli import main

raise SystemExit(main())
