"""flightgroup's benchmark suite: flightgroup side by side with its peers.

``python -m benchmarks`` (or ``scripts/dev bench``) runs every scenario in one
process and prints a Markdown report; ``--quick`` shrinks the sizes for a smoke
run; ``--write PATH`` also writes the report to PATH; ``--only directory`` runs
just the directory scope's section (``benchmarks/directory.py``). A peer that is not
installed is left out. The exit code is 1 only when flightgroup itself broke a
must (runs of fn, failure storm, leaked table entries) or crashed; a missed
speed target is reported, never hidden, and does not fail the run.
"""
