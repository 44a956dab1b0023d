#!/usr/bin/env bash
# The disk size of zhie's torch-free runtime (issue 25): a fresh venv, `pip install ".[runtime]"`, and what it added
# to site-packages, by package. Usage: bash benchmarks/runtime_size.sh [VENV_DIR]   (default: a temporary directory)
set -euo pipefail
venv=${1:-$(mktemp -d)/venv}
python3 -m venv "$venv"
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
before=$(du -sm "$site" | cut -f1)
"$venv/bin/pip" install -q "$(dirname "$0")/..[runtime]" 2>&1 | grep -v "^WARNING: Location" || true
after=$(du -sm "$site" | cut -f1)
"$venv/bin/python" -c "import torch" 2>/dev/null && { echo "torch is installed: not a runtime-only venv" >&2; exit 1; }
du -sm "$site"/* | sort -rn | head -12
echo "zhie[runtime] added $((after - before)) MB to a fresh venv ($before MB: pip and setuptools)"
