import sys
from pathlib import Path

# the integration helpers (smollm2.py) are imported by name from this folder
sys.path.insert(0, str(Path(__file__).parent))
