#!/usr/bin/env bash
# The peers' own environment (.venv-peers): smartnoise-synth 1.0.8 (MST, AIM) pins opacus 0.14,
# opendp 0.14 and pandas < 3, so it cannot share the project's .venv. The benchmark drives it
# as a subprocess (benchmarks/peers/run_peer.py: a CSV in, a CSV out).
#
#   bash benchmarks/peers/setup.sh            # creates /work/main/.venv-peers (or $PEERS_VENV)
#
# Idempotent: a venv that already imports snsynth at the pinned version is left as it is.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${PEERS_VENV:-$PWD/.venv-peers}"
PY="${PYTHON:-python3}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
sys.exit(0 if m.version("smartnoise-synth") == "1.0.8" else 1)
PY
then
  echo "peers venv ready: $VENV"
  exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# CPU torch first and pinned exactly (a local wheel; any other spec pulls a multi-GB CUDA build);
# opacus 0.14's torch>=1.3 is then satisfied and nothing else is downloaded for it.
"$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q "smartnoise-synth==1.0.8" "pandas>=2.2,<3" "numpy<3"
"$VENV/bin/python" -c "import snsynth, mbi; print('peers venv ready:', '$VENV')"
