"""Named stand-in for an engine that cannot run here (a GPU vLLM dying while loading weights):
prints a recorded real log line by line, then exits 1. Every other argument is ignored.

    python replay_engine.py LOG_FILE [engine args...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

for line in Path(sys.argv[1]).read_text().splitlines():
    print(line, flush=True)
    time.sleep(0.005)  # the recorded log's pace, not a wait
sys.exit(1)
