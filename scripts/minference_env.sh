# Sourced by the GPU runs that benchmark MInference 0.1.6 (the `minference` provider) on a machine
# without network. Everything the build needs travels in the git-ignored .minf/ (carry it):
#   minference-0.1.6.0.tar.gz  the sdist; its one extension, minference.cuda, is the CUDA index
#                              conversion (the attention kernels are Triton, compiled at run time);
#   wheel, ninja, psutil       build only: setup.py imports wheel.bdist_wheel and lists ninja and
#                              psutil in setup_requires, which setuptools would otherwise fetch;
#                              ninja also lets MAX_JOBS compile in parallel;
#   einops                     imported by `import minference`.
# The first call on a machine builds it into /tmp/minfsite (about a minute with nvcc); later calls
# on the same machine reuse that folder, with or without .minf/.
MINF_SITE=/tmp/minfsite
MINF_BUILD=/tmp/minfbuild
MINF_SRC=$MINF_BUILD/minference-0.1.6.0
if [ ! -d "$MINF_SITE/minference" ] && [ -f .minf/minference-0.1.6.0.tar.gz ]; then
  echo "minference_env: building MInference 0.1.6 into $MINF_SITE (log: $MINF_BUILD/build.log)" >&2
  rm -rf "$MINF_SITE.tmp" "$MINF_BUILD" && mkdir -p "$MINF_SITE.tmp" "$MINF_BUILD/tools" \
    && python3 -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir \
      --target "$MINF_BUILD/tools" .minf/wheel-*.whl .minf/ninja-*.whl .minf/psutil-*.whl \
    && tar -xzf .minf/minference-0.1.6.0.tar.gz -C "$MINF_BUILD" \
    || { echo "minference_env: unpacking .minf/ failed" >&2; rm -rf "$MINF_SRC"; }
  # Two edits to MInference's source, each checked to apply exactly, or the build stops:
  # 1. transformers 5 made `_is_package_available(name)` return a (found, version) tuple, which is
  #    always true, so `import minference` runs the three optional imports it guards (kivi_gemv,
  #    vllm, papyfaiss: CUDA builds we do not have) and fails. The ops submodules cannot be
  #    imported on their own (Python runs minference/__init__.py first), so the guards ask for
  #    the tuple explicitly (`return_version=True`, a tuple on transformers 4 too) and test [0].
  # 2. setup.py pins -std=c++17, which wins over torch's own flag; torch headers that demand
  #    C++20 (torch >= 2.14) then stop the build, so only there it becomes -std=c++20.
  if [ -d "$MINF_SRC" ]; then
    (
      cd "$MINF_SRC" \
        && sed -i -E 's/^if _is_package_available\("([a-z_]+)"\):$/if _is_package_available("\1", return_version=True)[0]:/' \
          minference/modules/kivi.py minference/modules/minference_forward.py \
          minference/modules/retr_attn.py \
        && [ "$(grep -c 'return_version=True)\[0\]:$' minference/modules/kivi.py \
          minference/modules/minference_forward.py minference/modules/retr_attn.py \
          | grep -c ':1$')" = 3 ] \
        && if python3 -c "import os, torch
h = os.path.join(os.path.dirname(torch.__file__), 'include', 'ATen', 'ATen.h')
raise SystemExit(0 if '202002L' in open(h).read() else 1)"; then
          sed -i 's/"-std=c++17"/"-std=c++20"/' setup.py && grep -q '"-std=c++20"' setup.py
        fi
    ) || { echo "minference_env: patching MInference's source failed" >&2; rm -rf "$MINF_SRC"; }
  fi
  # MINFERENCE_FORCE_BUILD skips setup.py's download of a prebuilt wheel from GitHub;
  # TORCH_CUDA_ARCH_LIST=9.0 compiles minference.cuda for Hopper (H100 and H200) only. Without
  # CUDA_HOME torch takes the toolkit from the nvcc on PATH, which may be a wrapper outside it
  # (then libcudart is not found at link time), so the standard toolkit folder is named when it
  # exists. It is installed into a scratch folder, moved into place only when the build and
  # einops both installed, so a broken build never looks complete to a later call.
  if [ -d "$MINF_SRC" ]; then
    (
      if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
        export CUDA_HOME=/usr/local/cuda
      fi
      cd "$MINF_SRC" \
        && python3 -c "from torch.utils.cpp_extension import CUDA_HOME; print('CUDA_HOME', CUDA_HOME)" \
        && PATH="$MINF_BUILD/tools/bin:$PATH" PYTHONPATH="$MINF_BUILD/tools${PYTHONPATH:+:$PYTHONPATH}" \
          TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 MINFERENCE_FORCE_BUILD=TRUE \
          python3 -m pip install -v --root-user-action=ignore --no-index --no-deps --no-build-isolation --no-cache-dir \
          --target "$MINF_SITE.tmp" .
    ) >"$MINF_BUILD/build.log" 2>&1 \
      && python3 -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir \
        --target "$MINF_SITE.tmp" .minf/einops-*.whl \
      && ls "$MINF_SITE.tmp"/minference/cuda*.so >/dev/null \
      && rm -rf "$MINF_SITE" && mv "$MINF_SITE.tmp" "$MINF_SITE" \
      || {
        echo "minference_env: build failed; its first errors, then the end of $MINF_BUILD/build.log:" >&2
        grep -m 20 -E 'error|Error' "$MINF_BUILD/build.log" >&2
        tail -n 30 "$MINF_BUILD/build.log" >&2
      }
  fi
fi
if [ -d "$MINF_SITE/minference" ]; then
  export PYTHONPATH=$MINF_SITE${PYTHONPATH:+:$PYTHONPATH}
  if python3 -c "from minference import streaming_forward, vertical_slash_sparse_attention" \
    >/tmp/minfimport.log 2>&1; then
    echo "minference_env: import of vertical_slash_sparse_attention and streaming_forward works"
  else
    echo "minference_env: import of vertical_slash_sparse_attention and streaming_forward FAILS:" >&2
    tail -n 15 /tmp/minfimport.log >&2
    return 1
  fi
else
  echo "minference_env: minference is not installed here (carry .minf/ once to build it)" >&2
  return 1
fi
