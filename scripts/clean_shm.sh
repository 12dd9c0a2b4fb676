#!/usr/bin/env bash
# Removes what processes of the clang sanitizer build leave in /dev/shm when they end without
# clean-up: LLVM OpenMP's registration file (__KMP_REGISTERED_LIB_<pid>_<uid>, written by every
# process that starts the runtime, e.g. the child of a forked trace check) and fuzz scratch files,
# each only once the process that made it is gone. /dev/shm is memory.
set -euo pipefail
[ -d /dev/shm ] || exit 0
gone=()
for f in /dev/shm/__KMP_REGISTERED_LIB_* /dev/shm/kvsim-fuzz-[0-9]*; do
  [ -e "$f" ] || continue
  name=${f##*/}
  if [[ "$name" == __KMP_* ]]; then pid=${name#__KMP_REGISTERED_LIB_}; pid=${pid%%_*}; else pid=${name#kvsim-fuzz-}; pid=${pid%%-*}; fi
  if [[ "$pid" =~ ^[0-9]+$ ]] && [ ! -d "/proc/$pid" ]; then gone+=("$f"); fi
done
if [ ${#gone[@]} -gt 0 ]; then
  printf '%s\0' "${gone[@]}" | xargs -0 rm -f
  echo "clean_shm: removed ${#gone[@]} files of ended processes from /dev/shm"
fi
