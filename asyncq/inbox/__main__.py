"""``python -m asyncq.inbox``: a standalone receiver."""

import sys

from asyncq.inbox.receiver import main

sys.exit(main())
