#!/bin/sh
# Runs a command with a CPU hog beside it: as many spinning processes as there are cores (or
# HOG_CPUS), started before the command and stopped after it, however it ends (exit, failure,
# Ctrl-C, SIGTERM). Used by `make test-hog` (docs/testing.md, "Under load"); the hog is not a test.
#
#   tests/hog/hog.sh COMMAND [ARG...]     e.g. tests/hog/hog.sh sh -c 'cd build && ctest -R Replay'
#
# The spinners are stress-ng's CPU workers (Debian package stress-ng) when it is installed, else
# shell busy loops of our own. They run at the default priority (nice 0), as other work on a shared
# host does. HOG_CPUS=0 runs the command without a hog; HOG_TOOL=shell uses the shell loops even
# where stress-ng is installed. Exit status: the command's.
set -u
if [ $# -eq 0 ]; then
  echo "usage: $0 COMMAND [ARG...]" >&2
  exit 2
fi
cpus=${HOG_CPUS:-$(nproc)}
case $cpus in '' | *[!0-9]*) echo "$0: HOG_CPUS must be a number, not '$cpus'" >&2; exit 2 ;; esac
pids=""
stop_hog() {
  for p in $pids; do kill "$p" 2>/dev/null; done
  for p in $pids; do wait "$p" 2>/dev/null; done
  pids=""
}
trap 'stop_hog' EXIT
trap 'stop_hog; exit 130' INT
trap 'stop_hog; exit 143' TERM
if [ "$cpus" -gt 0 ]; then
  if [ "${HOG_TOOL:-stress-ng}" != shell ] && command -v stress-ng >/dev/null 2>&1; then
    # --timeout: a safety net should this script itself be killed with SIGKILL.
    stress-ng --cpu "$cpus" --cpu-load 100 --timeout 3h --quiet &
    pids=$!
    echo "hog: stress-ng --cpu $cpus (pid $pids) beside: $*" >&2
  else
    i=0
    while [ "$i" -lt "$cpus" ]; do
      sh -c 'trap "exit 0" TERM; while :; do :; done' &
      pids="$pids $!"
      i=$((i + 1))
    done
    echo "hog: $cpus shell spinners (pids$pids) beside: $*" >&2
  fi
fi
"$@"
rc=$?
stop_hog
exit $rc
