#!/usr/bin/env bash
# Start the local services the tests need if they are down (PostgreSQL, MariaDB, Redis, RabbitMQ,
# NATS with JetStream), and install the browser the console's tests drive (Debian's Chromium) if it
# is missing. The Kafka-protocol broker and Spark are started by the test fixtures themselves.
set -u
pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
my_up() { mariadb-admin -h 127.0.0.1 -uroot --connect-timeout=2 ping >/dev/null 2>&1 || mysqladmin -h 127.0.0.1 -uroot ping >/dev/null 2>&1; }

if ! pg_up; then
  echo "services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  for _ in $(seq 1 60); do pg_up && break; sleep 0.5; done
fi
pg_up || { echo "services: PostgreSQL is not reachable on 127.0.0.1:5432" >&2; exit 1; }

if ! my_up; then
  echo "services: starting MariaDB"
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
  for _ in $(seq 1 60); do my_up && break; sleep 0.5; done
fi
my_up || { echo "services: MariaDB is not reachable on 127.0.0.1:3306" >&2; exit 1; }

# A TCP port that answers on loopback.
port_up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }

if ! redis_up; then
  echo "services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  for _ in $(seq 1 60); do redis_up && break; sleep 0.5; done
fi
redis_up || { echo "services: Redis is not reachable on 127.0.0.1:6379" >&2; exit 1; }

if ! port_up 5672; then
  echo "services: starting RabbitMQ"
  rabbitmq-server -detached || true
  for _ in $(seq 1 120); do port_up 5672 && break; sleep 0.5; done
fi
port_up 5672 || { echo "services: RabbitMQ is not reachable on 127.0.0.1:5672" >&2; exit 1; }

if ! port_up 4222; then
  echo "services: starting NATS (JetStream)"
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log || true
  for _ in $(seq 1 60); do port_up 4222 && break; sleep 0.5; done
fi
port_up 4222 || { echo "services: NATS is not reachable on 127.0.0.1:4222" >&2; exit 1; }
echo "services: PostgreSQL, MariaDB, Redis, RabbitMQ and NATS are up"

# Two packages from Debian, installed once (one `apt-get update` for both), as root, only when
# missing: tests/integration/ui drives Debian's chromium through Playwright (Playwright's own
# browser download is not reachable here); tests/integration/test_deploy.py checks
# deploy/prometheus/ with promtool (the prometheus package; its server is not started here: a
# test that needs one starts its own).
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "services: ${missing[*]} missing; install as root (apt-get install ${missing[*]}) for the console's browser tests and the alert rules' tests" >&2
    exit 1
  fi
  echo "services: installing ${missing[*]} (Debian's packages) for the console's browser tests and promtool"
  apt-get update -qq || { echo "services: apt-get update failed" >&2; exit 1; }
  for pkg in "${missing[@]}"; do
    # chromium with its recommended packages (its fonts), as it always was; prometheus without.
    extra=(); [ "$pkg" = prometheus ] && extra=(--no-install-recommends)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${extra[@]}" "$pkg" >/dev/null \
      || { echo "services: could not install $pkg" >&2; exit 1; }
  done
fi
echo "services: chromium is $(command -v chromium)"
echo "services: promtool is $(command -v promtool)"
