# Sourced by the benchmarks that can place their processes (bench, bench-cluster). Needs the
# caller's die and python3.

# place_processes PIN: sets on_servers and on_loads, the prefixes of the commands that start
# a redis-server and a load (an array each), and placement, what they do in words. With PIN
# true every redis-server runs on the last CPU this process may use and the loads on the
# others (taskset), so that a server's figures do not depend on where the scheduler puts a
# load, and no load runs on the servers' CPU; with false both are empty, the scheduler's
# choice.
place_processes() {
  on_servers=()
  on_loads=()
  placement="the scheduler's"
  [ "$1" = true ] || return 0
  command -v taskset >/dev/null 2>&1 || die "--pin needs taskset (Debian: util-linux)"
  local cpus server_cpu load_cpus
  # The CPUs this process may run on (a cpuset may leave out CPU 0), lowest first.
  read -r -a cpus < <(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')
  [ "${#cpus[@]}" -ge 2 ] || die "--pin needs two CPUs or more; this process may use ${cpus[*]}"
  server_cpu=${cpus[-1]}
  load_cpus=$(IFS=,; echo "${cpus[*]:0:${#cpus[@]}-1}")
  on_servers=(taskset -c "$server_cpu")
  on_loads=(taskset -c "$load_cpus")
  placement="Redis on CPU $server_cpu, the loads on CPU $load_cpus"
}
