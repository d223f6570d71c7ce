#!/usr/bin/env bash
# Start the local services the tests need if they are down (PostgreSQL, MariaDB). The Kafka-protocol
# broker and Spark are started by the test fixtures themselves.
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
echo "services: PostgreSQL and MariaDB are up"
