"""The in-process level: one group's flights in this process (DESIGN.md rule 1-3, 5).

- ``flight``: a flight's states, its attempts, waiters and how they are woken.
- ``table``: the flight table (key -> Flight), thread-safe; decides under its lock.
  Its parts (``tablestate``): ``fresh`` (fresh callers' claims), ``takeover``,
  ``kept`` (kept outcomes).
- ``follow``: the one wait loop's decisions, shared by async and sync callers.
- ``attempts``: where the leader's work runs, its deadline, retries and containment,
  and its landing.

It knows no wide scope: a wide group's table and flights extend these
(:mod:`flightgroup.scope.table`), and the bridge (:mod:`flightgroup.scope.bridge`)
carries a flight to its scope.
"""
