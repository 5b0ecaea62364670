# Sourced by the GPU scripts that need the `hopper` extra (flash-attn-4 and the CUTLASS DSL) on a
# machine without network. The wheels travel in two git-ignored folders, each under the 64 MiB a
# call may carry, on two calls to one warm machine:
#   .fa4a/: the small wheels and the first half of the cu13 DSL library (an xz tar, split);
#   .fa4b/: its second half.
# Each call stashes what it carries in /tmp/fa4stash (the checkout is copied afresh per call);
# once both halves are there, everything is installed into /tmp/fa4site, which later calls on
# the same machine reuse. The CUTLASS DSL's `cutlass` package lives in
# nvidia_cutlass_dsl/dsl_packages (a .pth entry in a normal install), hence the second path.
FA4_SITE=/tmp/fa4site
FA4_STASH=/tmp/fa4stash
mkdir -p "$FA4_STASH"
for d in .fa4a .fa4b; do [ -d "$d" ] && cp --update=none "$d"/* "$FA4_STASH"/; done
# Installed into a scratch folder first and moved into place only when every step succeeded, so a
# broken install never looks complete to a later call.
if [ ! -d "$FA4_SITE/flash_attn" ] && [ -f "$FA4_STASH/cu13.part.aa" ] && [ -f "$FA4_STASH/cu13.part.ab" ]; then
  rm -rf "$FA4_SITE.tmp" && mkdir -p "$FA4_SITE.tmp" \
    && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$FA4_SITE.tmp" "$FA4_STASH"/*.whl \
    && cat "$FA4_STASH/cu13.part.aa" "$FA4_STASH/cu13.part.ab" | xz -d | tar -x -C "$FA4_SITE.tmp" \
    && rm -rf "$FA4_SITE" && mv "$FA4_SITE.tmp" "$FA4_SITE" \
    || echo "fa4_env: install failed" >&2
fi
if [ -d "$FA4_SITE/flash_attn" ]; then
  export PYTHONPATH=$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
else
  echo "fa4_env: flash-attn-4 is not installed here (.fa4a and .fa4b both needed once)" >&2
fi
