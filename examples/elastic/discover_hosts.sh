#!/bin/sh
# Host discovery for ddlrun --elastic (Horovod's contract): print the hosts that may run
# ranks now, "host:slots" a line. ddlrun runs it every second while the job lives.
# This one prints the file named by $DDL_HOSTS_FILE (default: hosts.txt next to it); a
# real one asks the scheduler (e.g. `scontrol show hostnames`, a cloud API, a health check).
cat "${DDL_HOSTS_FILE:-$(dirname "$0")/hosts.txt}"
