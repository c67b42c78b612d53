#!/bin/bash
# Host time of two checkouts in turn (A, B, A, B, ...), each process alone: ab.sh SRC_A SRC_B ROUNDS METHOD...
# SRC_A, SRC_B: the checkouts' src folders (run with PYTHONPATH set to each); the same venv and extension build.
a=$1; b=$2; rounds=$3; shift 3
here=$(dirname "$0")
for _ in $(seq "$rounds"); do
  for src in "$a" "$b"; do
    echo "== $src"
    PYTHONPATH=$src python "$here/hostsplit.py" 3 "$@" 2>&1 | grep -v -E "Warn|Loading"
  done
done
