# Sourced by the GPU scripts: $OUT, the carried wheels (.whl: nox, av, scikit-video) on the path,
# and the NCCL settings the lent machines need (NVLink multicast off).
OUT=${OUT:-out}
mkdir -p "$OUT"
export OUT
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The packages' and apps' sources, for running them in the machine's own Python (no install).
SRC_PATH=$(ls -d "$PWD"/packages/*/src "$PWD"/apps/*/src | tr '\n' ':')
export SRC_PATH
