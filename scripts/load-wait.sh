# Sourced by the benchmark scripts. wait_for_load LIMIT: waits (up to 120 s) until the 1-minute
# load average per CPU is below LIMIT ("off": returns at once), so a run does not start on top
# of someone else's build; says so when it gives up and measures anyway.
wait_for_load() {
  local limit=$1 waited=0
  [ "$limit" = off ] && return 0
  while [ "$waited" -lt 120 ]; do
    awk -v l="$limit" -v n="$(nproc)" '{ exit !($1 / n < l) }' /proc/loadavg && return 0
    sleep 5
    waited=$((waited + 5))
  done
  echo "   (machine still busy after 120 s: load $(cut -d' ' -f1 /proc/loadavg); measuring anyway)"
}
