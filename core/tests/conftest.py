import sys
from pathlib import Path

# the shared test helpers (hf_parity.py) are imported by name from this folder
sys.path.insert(0, str(Path(__file__).parent))
