#!/usr/bin/env bash
# Runs manifests_test.py with the system interpreter, whose python3-yaml and python3-jsonschema
# scripts/setup.sh installs (not whatever python3 comes first on PATH).
set -euo pipefail
exec /usr/bin/python3 -B deploy/k8s/manifests_test.py "$@"
