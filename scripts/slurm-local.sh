#!/usr/bin/env bash
# A real, private, single-machine Slurm cluster for development and CI.
#
#   scripts/slurm-local.sh install   # Debian packages (idempotent, needs root)
#   scripts/slurm-local.sh start     # munge + MariaDB + slurmdbd + slurmctld + 3 slurmd
#   scripts/slurm-local.sh status    # exit 0 and print sinfo when running, 3 when not
#   scripts/slurm-local.sh stop      # stop exactly the daemons that `start` recorded
#   scripts/slurm-local.sh env       # print `export SLURM_CONF=...`
#
# Everything lives under ${MEMX_SLURM_DIR:-/var/tmp/memx-slurm}: config, spool,
# logs, pids, the munge key and private socket, the MariaDB datadir and the fake
# GPU device files. Three fake nodes run as `slurmd -N` on this host, one per
# vendor partition (nvidia_a100, amd_mi250, nvidia_v100), each with 2 CPUs and two
# typed fake GPUs (character devices cloned from /dev/null); partition `debug`
# (the default) holds all three.
#
# So that clients work without SLURM_CONF, `start` copies the generated
# slurm.conf and gres.conf to /etc/slurm/ with a marker on the first line; it never
# overwrites an /etc/slurm/slurm.conf that lacks the marker (then export SLURM_CONF,
# see `env`).
#
# Needs root (the daemons run as SlurmUser=root). Works without systemd and
# without cgroups.
set -euo pipefail

STATE="${MEMX_SLURM_DIR:-/var/tmp/memx-slurm}"
FOREIGN_ETC=0
MARKER="# written by memx-hpc scripts/slurm-local.sh"
CLUSTER=memx
START_TIMEOUT="${MEMX_SLURM_START_TIMEOUT:-60}"
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge libpmix2 mariadb-server)

# node name, GPU type, partition (one node per vendor partition)
NODES=(a100n0 mi250n0 v100n0)
declare -A GPU_TYPE=([a100n0]=a100 [mi250n0]=mi250 [v100n0]=v100)
declare -A PARTITION=([a100n0]=nvidia_a100 [mi250n0]=amd_mi250 [v100n0]=nvidia_v100)
GPUS_PER_NODE=2

ETC="$STATE/etc"
CONF="$ETC/slurm.conf"
RUN="$STATE/run"
LOGDIR="$STATE/log"
MUNGE_DIR="$STATE/munge"
MUNGE_SOCK="$MUNGE_DIR/munge.socket"
DB_DIR="$STATE/mysql"
DB_SOCK="$STATE/mysqld.sock"
DB_USER=slurm
DB_PASS=memx-local-slurm
# stop order: compute daemons first, munge last
DAEMONS=(slurmd-a100n0 slurmd-mi250n0 slurmd-v100n0 slurmctld slurmdbd mariadbd munged)

log() { printf '[slurm-local] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need_root() {
  [[ $(id -u) -eq 0 ]] || die "must run as root (the private daemons run as SlurmUser=root)"
}

# ---------------------------------------------------------------- install ----
cmd_install() {
  need_root
  local missing=() p st
  for p in "${PACKAGES[@]}"; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ $st == "install ok installed" ]] || missing+=("$p")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "all packages already installed: ${PACKAGES[*]}"
    return 0
  fi
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Refresh the package lists only when they are missing or a first try fails.
  if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
    apt-get update -q
  fi
  local args=(-y -q --no-install-recommends -o Dpkg::Options::=--force-confdef
              -o Dpkg::Options::=--force-confold)
  if ! apt-get install "${args[@]}" "${PACKAGES[@]}"; then
    log "first install attempt failed; running apt-get update and retrying"
    apt-get update -q
    apt-get install "${args[@]}" "${PACKAGES[@]}"
  fi
}

# ---------------------------------------------------------------- helpers ----
pidfile() { echo "$RUN/$1.pid"; }

# The executable a recorded daemon must be running (guards against PID reuse).
daemon_exe() {
  case $1 in
    slurmd-*) echo slurmd ;;
    *) echo "$1" ;;
  esac
}

# Prints the PID of a recorded daemon if that process is alive and is the
# expected program; returns 1 otherwise.
daemon_pid() {
  local f pid exe
  f=$(pidfile "$1")
  [[ -s $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ -d /proc/$pid ]] || return 1
  # zombie = dead
  [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] || return 1
  exe=$(daemon_exe "$1")
  # comm is truncated to 15 chars; compare the executable name from cmdline too
  if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$exe" ]] ||
     [[ $( { tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null | head -n1) == *"/$exe" ]]; then
    echo "$pid"
    return 0
  fi
  return 1
}

alive() { daemon_pid "$1" >/dev/null; }

daemon_log() {
  case $1 in
    munged) echo "$LOGDIR/munged.log" ;;
    mariadbd) echo "$LOGDIR/mariadbd.err" ;;
    slurmdbd) echo "$LOGDIR/slurmdbd.log" ;;
    slurmctld) echo "$LOGDIR/slurmctld.log" ;;
    slurmd-*) echo "$LOGDIR/slurmd-${1#slurmd-}.log" ;;
  esac
}

show_log_tail() {
  local name=$1 f
  for f in "$(daemon_log "$name")" "$LOGDIR/$name.out"; do
    if [[ -s $f ]]; then
      log "---- last lines of $f ----"
      tail -n 25 "$f" >&2 || true
    fi
  done
}

# Start a daemon in the foreground mode of its own, detached into a new session,
# and record its PID ourselves.
spawn() {
  local name=$1; shift
  # Without job control a background child is not a process-group leader, so
  # setsid(1) calls setsid() and execs in place: $! is the daemon's PID.
  setsid "$@" </dev/null >"$LOGDIR/$name.out" 2>&1 &
  local pid=$! i
  echo "$pid" >"$(pidfile "$name")"
  # Until the child has exec'd, /proc/PID/comm still says bash or setsid and
  # alive() would call the daemon dead: wait for the exec (or the exit).
  for ((i = 0; i < 100; i++)); do
    alive "$name" && return 0
    [[ -d /proc/$pid ]] || return 0
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && return 0
    sleep 0.05
  done
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Ports: ctld, dbd, mysql, then one per node. Reuse the previous choice when it
# is still free (so saved node state matches); otherwise shift the block.
choose_ports() {
  local base p ok
  if [[ -s $STATE/ports.env ]]; then
    # shellcheck disable=SC1091
    source "$STATE/ports.env"
    ok=1
    for p in "$CTLD_PORT" "$DBD_PORT" "$DB_PORT" "${NODE_PORTS[@]}"; do
      port_in_use "$p" && ok=0
    done
    [[ $ok == 1 ]] && return 0
  fi
  for ((base = 16817; base < 26817; base += 100)); do
    CTLD_PORT=$base; DBD_PORT=$((base + 2)); DB_PORT=$((base + 13))
    NODE_PORTS=($((base + 3)) $((base + 4)) $((base + 5)))
    ok=1
    for p in "$CTLD_PORT" "$DBD_PORT" "$DB_PORT" "${NODE_PORTS[@]}"; do
      port_in_use "$p" && { ok=0; break; }
    done
    if [[ $ok == 1 ]]; then
      printf 'CTLD_PORT=%s\nDBD_PORT=%s\nDB_PORT=%s\nNODE_PORTS=(%s)\n' \
        "$CTLD_PORT" "$DBD_PORT" "$DB_PORT" "${NODE_PORTS[*]}" >"$STATE/ports.env"
      return 0
    fi
  done
  die "no free block of local ports found in 16817-26817"
}

# ------------------------------------------------------------------ config ---
write_configs() {
  local host mem_mb real_mem i n t gres_tmp
  host=$(hostname -s 2>/dev/null || hostname)
  mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
  real_mem=6000
  ((mem_mb - 512 < real_mem)) && real_mem=$((mem_mb - 512))

  {
    echo "$MARKER"
    echo "# Generated $(date -Is) for state dir $STATE. Do not edit; rerun start."
    cat <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
CredType=cred/munge
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.daemon.pid
SlurmdPidFile=$STATE/run/slurmd-%n.daemon.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No systemd, no cgroups: track processes through /proc, bind no tasks.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Only the backfill scheduler starts hetjobs; poll it every second.
SchedulerParameters=bf_interval=1,bf_hetjob_immediate
# With MpiDefault=none, srun -n 2 silently gives two size-1 MPI worlds.
MpiDefault=pmi2
MailProg=/bin/true
MinJobAge=3600
KillWait=5
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=60
SlurmdTimeout=120
InactiveLimit=0
Waittime=0
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# The slurmdbd connection ignores AuthInfo; it takes the munge socket from here.
AccountingStoragePass=$MUNGE_SOCK
AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:mi250,gres/gpu:v100
JobCompType=jobcomp/none
EOF
    i=0
    for n in "${NODES[@]}"; do
      echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=${NODE_PORTS[$i]} CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=$real_mem Gres=gpu:${GPU_TYPE[$n]}:$GPUS_PER_NODE State=UNKNOWN"
      i=$((i + 1))
    done
    for n in "${NODES[@]}"; do
      echo "PartitionName=${PARTITION[$n]} Nodes=$n MaxTime=INFINITE State=UP"
    done
    local all
    all=$(IFS=,; echo "${NODES[*]}")
    echo "PartitionName=debug Nodes=$all Default=YES MaxTime=INFINITE State=UP"
  } >"$CONF.tmp"
  mv -f "$CONF.tmp" "$CONF"

  {
    echo "$MARKER"
    echo "# Fake GPUs: character devices cloned from /dev/null."
    echo "AutoDetect=off"
    for n in "${NODES[@]}"; do
      t=${GPU_TYPE[$n]}
      echo "NodeName=$n Name=gpu Type=$t File=$STATE/dev/$n/${t}gpu[0-$((GPUS_PER_NODE - 1))]"
    done
  } >"$ETC/gres.conf.tmp"
  mv -f "$ETC/gres.conf.tmp" "$ETC/gres.conf"

  # slurmdbd refuses a config that others can read.
  ( umask 077
    cat >"$ETC/slurmdbd.conf.tmp" <<EOF
$MARKER
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$LOGDIR/slurmdbd.log
PidFile=$STATE/run/slurmdbd.daemon.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
  )
  chmod 600 "$ETC/slurmdbd.conf.tmp"
  mv -f "$ETC/slurmdbd.conf.tmp" "$ETC/slurmdbd.conf"

  # fake GPU device files
  for n in "${NODES[@]}"; do
    t=${GPU_TYPE[$n]}
    mkdir -p "$STATE/dev/$n" "$STATE/spool/$n"
    for ((i = 0; i < GPUS_PER_NODE; i++)); do
      [[ -c $STATE/dev/$n/${t}gpu$i ]] || mknod -m 666 "$STATE/dev/$n/${t}gpu$i" c 1 3
    done
  done
}

# Copy slurm.conf and gres.conf to /etc/slurm unless a foreign config is there.
install_etc_config() {
  local f foreign=0
  for f in slurm.conf gres.conf; do
    if [[ -e /etc/slurm/$f ]] && [[ $(head -n1 "/etc/slurm/$f") != "$MARKER" ]]; then
      foreign=1
    fi
  done
  if [[ $foreign == 1 ]]; then
    FOREIGN_ETC=1
    log "NOT overwriting /etc/slurm/slurm.conf or gres.conf: they were not written by this script."
    log "Slurm clients will not find this local cluster by themselves. Export SLURM_CONF in every shell that uses it:"
    echo "export SLURM_CONF=$CONF"
    return 0
  fi
  mkdir -p /etc/slurm
  for f in slurm.conf gres.conf; do
    cp -f "$ETC/$f" "/etc/slurm/.$f.memx.tmp"
    chmod 644 "/etc/slurm/.$f.memx.tmp"
    mv -f "/etc/slurm/.$f.memx.tmp" "/etc/slurm/$f"
  done
}

# ------------------------------------------------------------------ waiting --
# wait_for NAME DESCRIPTION CMD...: poll CMD until it succeeds, failing when the
# daemon NAME dies or the start deadline passes.
wait_for() {
  local name=$1 what=$2; shift 2
  while true; do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! alive "$name"; then
      log "$name exited while waiting for: $what"
      show_log_tail "$name"
      return 1
    fi
    if ((SECONDS >= DEADLINE)); then
      log "timed out (${START_TIMEOUT}s) waiting for: $what"
      show_log_tail "$name"
      return 1
    fi
    sleep 0.2
  done
}

check_all_alive() {
  local d
  for d in "$@"; do
    if ! alive "$d"; then
      log "$d is not running"
      show_log_tail "$d"
      return 1
    fi
  done
}

nodes_idle() {
  local out
  out=$(SLURM_CONF="$CONF" timeout 5 sinfo -h -N -p debug -o '%N %t') || return 1
  local n
  for n in "${NODES[@]}"; do
    grep -qE "^$n idle$" <<<"$out" || return 1
  done
}

# Resume nodes left DOWN/DRAINED by an earlier run; fail fast on INVAL.
fix_nodes() {
  local out name st
  out=$(SLURM_CONF="$CONF" timeout 5 sinfo -h -N -p debug -o '%N %t') || return 0
  while read -r name st; do
    case $st in
      inval*)
        log "node $name is INVALID (its slurmd reported less than slurm.conf says)"
        SLURM_CONF="$CONF" timeout 5 scontrol show node "$name" | grep -i reason >&2 || true
        show_log_tail "slurmd-$name"
        return 1 ;;
      down*|drain*|drng*|fail*)
        SLURM_CONF="$CONF" timeout 5 scontrol update NodeName="$name" State=RESUME >/dev/null 2>&1 || true ;;
    esac
  done <<<"$out"
}

sacct_answers() { SLURM_CONF="$CONF" timeout 10 sacct -n -X -S now-1hour -o JobID >/dev/null; }

mysql_ping() { timeout 5 mariadb-admin --no-defaults --socket="$DB_SOCK" -uroot ping; }

# -------------------------------------------------------------------- start --
START_OK=1
on_start_exit() {
  if [[ $START_OK != 1 ]]; then
    log "start failed; stopping what was started (logs stay in $LOGDIR)"
    cmd_stop >/dev/null 2>&1 || true
  fi
}

cmd_start() {
  need_root
  local t0=$SECONDS d running=0 stale=0
  for d in "${DAEMONS[@]}"; do
    if alive "$d"; then running=$((running + 1)); elif [[ -e $(pidfile "$d") ]]; then stale=1; fi
  done
  if ((running == ${#DAEMONS[@]})); then
    if SLURM_CONF="$CONF" timeout 5 sinfo -h -o %P >/dev/null 2>&1; then
      install_etc_config
      fix_nodes || true
      log "already running (state dir $STATE); nothing to do"
      return 0
    fi
    log "all daemons are alive but sinfo does not answer; restarting"
    cmd_stop
  elif ((running > 0)); then
    log "only $running of ${#DAEMONS[@]} daemons are running; restarting all of them"
    cmd_stop
  elif ((stale)); then
    rm -f "$RUN"/*.pid
  fi

  for b in munged mariadbd mariadb-install-db slurmdbd slurmctld slurmd sinfo sacct; do
    command -v "$b" >/dev/null 2>&1 || [[ -x /usr/sbin/$b ]] ||
      die "$b not found; run: $0 install"
  done
  export PATH="$PATH:/usr/sbin:/sbin"

  mkdir -p "$STATE" "$ETC" "$RUN" "$LOGDIR" "$MUNGE_DIR" "$STATE/spool/ctld"
  # Clients must reach the munge socket: 755 on the state dir and munge dir.
  chmod 755 "$STATE" "$MUNGE_DIR"
  choose_ports
  write_configs
  install_etc_config

  DEADLINE=$((SECONDS + START_TIMEOUT))
  START_OK=0
  trap on_start_exit EXIT

  # munge ---------------------------------------------------------------
  if [[ ! -s $MUNGE_DIR/munge.key ]]; then
    ( umask 077; dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none )
  fi
  chmod 600 "$MUNGE_DIR/munge.key"
  rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock"
  spawn munged munged --foreground --force --key-file="$MUNGE_DIR/munge.key" \
    --socket="$MUNGE_SOCK" --pid-file="$MUNGE_DIR/munged.pid" \
    --seed-file="$MUNGE_DIR/munged.seed" --log-file="$LOGDIR/munged.log" --num-threads=2
  wait_for munged "munge socket" test -S "$MUNGE_SOCK"
  wait_for munged "munge credential round trip" \
    bash -c "munge -S '$MUNGE_SOCK' -n | unmunge -S '$MUNGE_SOCK'"

  # MariaDB ---------------------------------------------------------------
  if [[ ! -d $DB_DIR/mysql ]]; then
    log "initialising MariaDB datadir $DB_DIR"
    rm -rf "$DB_DIR"
    mariadb-install-db --no-defaults --user=root --datadir="$DB_DIR" \
      --auth-root-authentication-method=socket --skip-test-db \
      >"$LOGDIR/mariadb-install-db.log" 2>&1 ||
      { tail -n 25 "$LOGDIR/mariadb-install-db.log" >&2; false; }
  fi
  rm -f "$DB_SOCK"
  spawn mariadbd mariadbd --no-defaults --user=root --datadir="$DB_DIR" \
    --port="$DB_PORT" --bind-address=127.0.0.1 --socket="$DB_SOCK" \
    --pid-file="$RUN/mariadbd.daemon.pid" --log-error="$LOGDIR/mariadbd.err" \
    --skip-name-resolve --innodb-buffer-pool-size=1G --innodb-lock-wait-timeout=900 \
    --innodb-log-file-size=64M
  wait_for mariadbd "MariaDB on port $DB_PORT" mysql_ping
  timeout 20 mariadb --no-defaults --socket="$DB_SOCK" -uroot -e "
    CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
    CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
    GRANT ALL ON *.* TO '$DB_USER'@'127.0.0.1';
    GRANT ALL ON *.* TO '$DB_USER'@'localhost';
    FLUSH PRIVILEGES;"

  # slurmdbd, slurmctld, slurmd ------------------------------------------------
  export SLURM_CONF="$CONF"
  spawn slurmdbd slurmdbd -D
  wait_for slurmdbd "slurmdbd on port $DBD_PORT" port_in_use "$DBD_PORT"

  spawn slurmctld slurmctld -D -i
  wait_for slurmctld "slurmctld answering (scontrol ping)" \
    bash -c "timeout 5 scontrol ping | grep -q 'is UP'"

  local n
  for n in "${NODES[@]}"; do
    spawn "slurmd-$n" slurmd -D -N "$n"
  done
  local fixed=0
  while ! nodes_idle; do
    check_all_alive "${DAEMONS[@]}"
    if ((SECONDS >= DEADLINE)); then
      log "timed out (${START_TIMEOUT}s) waiting for nodes ${NODES[*]} to be idle"
      SLURM_CONF="$CONF" timeout 5 sinfo -N -p debug -o '%N %t %E' >&2 || true
      for n in "${NODES[@]}"; do show_log_tail "slurmd-$n"; done
      show_log_tail slurmctld
      false
    fi
    if ((fixed == 0 && SECONDS - t0 > 3)); then fix_nodes; fixed=1; fi
    sleep 0.3
  done
  wait_for slurmdbd "sacct answering" sacct_answers
  check_all_alive "${DAEMONS[@]}"
  START_OK=1
  trap - EXIT

  log "started in $((SECONDS - t0)) s; state dir $STATE"
  if [[ $FOREIGN_ETC == 1 ]]; then
    log "REMINDER: /etc/slurm/slurm.conf belongs to another Slurm; before using this cluster run:"
    echo "export SLURM_CONF=$CONF"
  fi
  SLURM_CONF="$CONF" timeout 5 sinfo -o '%P %D %t %N %G' || true
}

# --------------------------------------------------------------------- stop --
cmd_stop() {
  local d pid any=0 i
  # Cancel jobs first so no job step outlives its slurmd.
  if alive slurmctld; then
    local jobs
    jobs=$(SLURM_CONF="$CONF" timeout 5 squeue -h -o %A 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      log "cancelling jobs: $(echo $jobs)"
      # shellcheck disable=SC2086
      SLURM_CONF="$CONF" timeout 10 scancel $jobs >/dev/null 2>&1 || true
      for ((i = 0; i < 50; i++)); do
        [[ -z $(SLURM_CONF="$CONF" timeout 5 squeue -h -o %A 2>/dev/null || true) ]] && break
        sleep 0.2
      done
    fi
  fi
  for d in "${DAEMONS[@]}"; do
    if pid=$(daemon_pid "$d"); then
      any=1
      kill -TERM "$pid" 2>/dev/null || true
      for ((i = 0; i < 100; i++)); do
        alive "$d" || break
        sleep 0.2
      done
      if alive "$d"; then
        log "$d (pid $pid) ignored SIGTERM for 20 s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.2
      fi
      log "stopped $d (pid $pid)"
    fi
    rm -f "$(pidfile "$d")"
  done
  [[ $any == 1 ]] || log "not running (state dir $STATE)"
  return 0
}

# ------------------------------------------------------------------- status --
cmd_status() {
  local d down=()
  for d in "${DAEMONS[@]}"; do
    alive "$d" || down+=("$d")
  done
  if [[ ${#down[@]} -gt 0 ]]; then
    log "not running (state dir $STATE): ${down[*]} down"
    return 3
  fi
  if ! SLURM_CONF="$CONF" timeout 5 sinfo -o '%P %D %t %N %G'; then
    log "daemons are alive but sinfo does not answer"
    return 3
  fi
}

cmd_env() {
  [[ -s $CONF ]] || log "note: $CONF does not exist yet; run: $0 start"
  echo "export SLURM_CONF=$CONF"
}

usage() {
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) cmd_env ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
