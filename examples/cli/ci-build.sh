#!/bin/sh
# A CI step: build this commit once, however many jobs of the pipeline need the
# build at the same time. The first job runs the build; the others join it, print
# its output and exit with its exit code (a failed build fails every job that
# waited for it). A job that comes after the build ended builds again: use the
# build cache of your CI for that; this only stops concurrent duplicates.
#
#   ci-build.sh [CMD [ARG...]]        (default: make build)
#
# Jobs on one runner host share the run through a directory (FLIGHTGROUP_DIR, else
# flightgroup's default); jobs on several runners through Redis (FLIGHTGROUP_REDIS,
# FLIGHTGROUP_NAMESPACE). BUILD_WAIT bounds how long a joining job waits (seconds).
set -eu

rev=${GITHUB_SHA:-${CI_COMMIT_SHA:-$(git rev-parse HEAD)}}
[ $# -gt 0 ] || set -- make build

if [ -n "${FLIGHTGROUP_REDIS:-}" ]; then
    set -- --redis "$FLIGHTGROUP_REDIS" --namespace "${FLIGHTGROUP_NAMESPACE:-ci}" -- "$@"
elif [ -n "${FLIGHTGROUP_DIR:-}" ]; then
    set -- --dir "$FLIGHTGROUP_DIR" -- "$@"
else
    set -- -- "$@"
fi
exec flightgroup run --key "build:$rev" --timeout "${BUILD_WAIT:-1800}" "$@"
