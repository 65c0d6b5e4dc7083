#!/usr/bin/env bash
# Coverage is not collected in the offline build; exit cleanly so test actions do not fail.
exit 0
