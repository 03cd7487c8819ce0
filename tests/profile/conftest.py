import sys
from pathlib import Path

# The test steps are imported by path ("steps:gpt_step"), as a user's would be.
sys.path.insert(0, str(Path(__file__).parent))
