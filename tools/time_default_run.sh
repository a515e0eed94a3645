#!/bin/bash
# Time the default run as a new user meets it: a fresh clone of this repository's HEAD, then
# `/usr/bin/time -v make run` (the .venv build included). Every 20 s it samples the CPU of each
# thread of the Snakemake process (/proc/<pid>/task/*/stat; threads named by py-spy dump are, in
# creation order: MainThread, reprozoo-tracking, the executor pool), so the scheduler's share can be
# told from the MLflow logging thread's. The README's timing paragraph quotes these files.
#   usage: tools/time_default_run.sh [OUT_DIR] [CLONE_DIR]     (defaults: /tmp/reprozoo-timed, /tmp/reprozoo-fresh)
set -u
OUT=${1:-/tmp/reprozoo-timed}
CLONE=${2:-/tmp/reprozoo-fresh}
SRC=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
rm -rf "$CLONE" "$OUT"; mkdir -p "$OUT"
git clone -q "$SRC" "$CLONE"
cd "$CLONE"
git log -1 --format='%H %s' > "$OUT/commit.txt"
date -u +%FT%TZ > "$OUT/start.txt"
( /usr/bin/time -v make run > "$OUT/make_run.log" 2> "$OUT/time.txt"; echo $? > "$OUT/rc" ) &
RUN=$!
while kill -0 $RUN 2>/dev/null; do
  for p in $(pgrep -f "$CLONE/.venv/bin/python .venv/bin/snakemake --cores"); do
    for t in /proc/$p/task/*; do
      [ -r "$t/stat" ] || continue
      set -- $(sed 's/^.*) //' "$t/stat")
      echo "$(date +%s) $p $(basename "$t") utime=${12} stime=${13} tck=$(getconf CLK_TCK)" >> "$OUT/thread_samples.txt"
    done
  done
  sleep 20
done
date -u +%FT%TZ > "$OUT/end.txt"
# per thread, its last sample (CPU seconds)
awk '{split($4,u,"=");split($5,s,"=");split($6,k,"="); t[$3]=(u[2]+s[2])/k[2]} END{for(i in t) if (t[i] > 0.05) printf "%s %.1f\n", i, t[i]}' \
  "$OUT/thread_samples.txt" 2>/dev/null | sort -k2 -n -r > "$OUT/thread_cpu.txt"
echo "rc $(cat "$OUT/rc"); $(grep -E 'Elapsed \(wall' "$OUT/time.txt" | sed 's/^\s*//'); files in $OUT"
