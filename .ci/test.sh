#!/usr/bin/env bash
# The project's test command (README): lint, then the test suite on every
# Keras backend -- the full suite on JAX (including the full-size parameter
# counts, the tests marked `once`, which start their own backend in a
# subprocess, and the docstring examples), every layer/model/converter check
# on TensorFlow and PyTorch --
# then short real runs of the main example and of every recipe.
# Each pass runs its tests on one pytest-xdist worker per logical CPU (at
# most 4): most tests are bound by single-threaded tracing and compilation,
# so two workers on the 2-core machines about halve a pass (timings in the
# CHANGELOG).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONHASHSEED=0
# One JAX persistent compilation cache for the whole run: the suite compiles
# the same XLA programs again and again (tiny models rebuilt per test, in two
# workers and in the smoke runs), and a hit skips XLA's compile. Results are
# identical (the cache returns the executable compiled for the same program).
# Timings in the CHANGELOG, like the workers' above.
if [ -z "${JAX_COMPILATION_CACHE_DIR:-}" ]; then
  JAX_COMPILATION_CACHE_DIR=$(mktemp -d)
  trap 'rm -rf "$JAX_COMPILATION_CACHE_DIR"' EXIT
fi
export JAX_COMPILATION_CACHE_DIR
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0

"$PYTHON" -m ruff check keras_jumbo tests examples benchmarks tflite recipes
"$PYTHON" -m ruff format --check keras_jumbo tests examples benchmarks tflite recipes

status=0
for backend in jax tensorflow torch; do
  marker=()
  doctests=()
  [ "$backend" = jax ] || marker=(-m "not large and not once")
  # The docstring examples (>>>) run once, in the JAX pass.
  [ "$backend" = jax ] && doctests=(--doctest-modules keras_jumbo)
  echo "=== pytest, KERAS_BACKEND=$backend ==="
  KERAS_BACKEND=$backend "$PYTHON" -m pytest -q -p no:warnings \
    -n logical --maxprocesses 4 "${marker[@]}" "${doctests[@]}" tests || status=1
done

echo "=== example smoke run (real Fashion-MNIST, JAX) ==="
KERAS_BACKEND=jax CI=1 "$PYTHON" examples/train_fashion_mnist.py \
  --epochs 1 --train-examples 2048 || status=1
echo "=== fine-tuning example smoke run (random-weight preset, offline) ==="
KERAS_BACKEND=jax CI=1 "$PYTHON" examples/finetune_pretrained.py \
  --random-preset --epochs 1 --train-examples 1024 || status=1
echo "=== time-series recipe smoke run (real GunPoint, Appliances Energy) ==="
KERAS_BACKEND=jax "$PYTHON" -m recipes.time_series --smoke || status=1
echo "=== image recipe smoke runs (real Fashion-MNIST) ==="
smoke_dir=$(mktemp -d)
smoke=(--smoke --train-examples 2048 --verbose 2)
KERAS_BACKEND=jax "$PYTHON" -m recipes.jumbo_imagenet1k "${smoke[@]}" \
  --output-dir "$smoke_dir/in1k" || status=1
KERAS_BACKEND=jax "$PYTHON" -m recipes.jumbo_imagenet1k "${smoke[@]}" \
  --stage finetune --init "$smoke_dir/in1k/model.keras" \
  --output-dir "$smoke_dir/in1k_ft" || status=1
KERAS_BACKEND=jax "$PYTHON" -m recipes.jumbo_imagenet21k "${smoke[@]}" \
  --output-dir "$smoke_dir/in21k" || status=1
# Non-Deep ViT, the paper's three stages chained.
KERAS_BACKEND=torch "$PYTHON" -m recipes.non_deep_vit "${smoke[@]}" \
  --stage pretrain --output-dir "$smoke_dir/non_deep_pre" || status=1
KERAS_BACKEND=torch "$PYTHON" -m recipes.non_deep_vit "${smoke[@]}" \
  --stage join --init "$smoke_dir/non_deep_pre/model.keras" \
  --output-dir "$smoke_dir/non_deep" || status=1
KERAS_BACKEND=torch "$PYTHON" -m recipes.non_deep_vit "${smoke[@]}" \
  --stage finetune --init "$smoke_dir/non_deep/plain.keras" \
  --output-dir "$smoke_dir/non_deep_ft" || status=1
KERAS_BACKEND=tensorflow "$PYTHON" -m recipes.vit_resnas_supernet \
  "${smoke[@]}" --output-dir "$smoke_dir/resnas" || status=1
rm -rf "$smoke_dir"
exit $status
