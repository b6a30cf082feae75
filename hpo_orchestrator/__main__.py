from __future__ import annotations

import sys

from hpo_orchestrator.cli import main

sys.exit(main())
