#!/bin/sh
# Builds today's report once, however many cron jobs fire at the same time (the
# same crontab on several hosts, or several users' crontabs): the first one runs
# the command, the others join its run, print its output and exit with its code.
#
#   cron-report.sh [CMD [ARG...]]     (default: python3 -m reports.build)
#
# Every process of this host that names the same --dir shares the run
# (FLIGHTGROUP_DIR, else flightgroup's default directory of this user); with
# FLIGHTGROUP_REDIS set, every host that names the same Redis and namespace does.
set -eu

day=$(date -u +%F)
[ $# -gt 0 ] || set -- python3 -m reports.build "$day"

if [ -n "${FLIGHTGROUP_REDIS:-}" ]; then
    exec flightgroup run --key "report:$day" \
        --redis "$FLIGHTGROUP_REDIS" --namespace "${FLIGHTGROUP_NAMESPACE:-reports}" -- "$@"
elif [ -n "${FLIGHTGROUP_DIR:-}" ]; then
    exec flightgroup run --key "report:$day" --dir "$FLIGHTGROUP_DIR" -- "$@"
else
    exec flightgroup run --key "report:$day" -- "$@"
fi
