#!/usr/bin/env bash
# Creates reference/.venv with PyTorch & co. for the fixture generators and comparison benchmarks.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python3 -m venv "$here/.venv"
"$here/.venv/bin/pip" install -q -r "$here/requirements.txt"
echo "reference venv ready: $here/.venv/bin/python"
