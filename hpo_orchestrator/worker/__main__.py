from __future__ import annotations

import sys

from hpo_orchestrator.worker._child import main

sys.exit(main(sys.argv[1:]))
